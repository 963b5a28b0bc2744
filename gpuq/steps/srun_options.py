"""srun's command line inside a gpuq job (and `gpuq run`'s inside a job): the options that
scripts written for SLURM pass, read with SLURM's meaning; the ones that change nothing here are
accepted with one warning line; anything else is refused with one line (exit 2).

Syntax as srun's (getopt_long): `-n4`, `-n 4`, `--ntasks=4`, `--ntasks 4`; an option with an
optional value takes it only after `=` (`--kill-on-bad-exit=0`, `-K0`); the first word that is
not an option starts the command, and `--` ends the options. `gpuq run` style (`gpuq=True`)
also takes `--kill-on-bad-exit 0` and `--label` as gpuq's own CLI writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuq.errors import InvalidInput


@dataclass
class SrunOptions:
    ntasks: int | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_task: int | None = None
    output: str | None = None
    error: str | None = None
    label: bool = False
    unbuffered: bool = False  # -u: each task's output passed on as it comes, not by lines
    kill_on_bad_exit: bool | None = None  # None: the default (SLURM's KillOnBadExit=1)
    export: str | None = None
    chdir: str | None = None
    overcommit: bool = False
    jobid: str | None = None
    help: bool = False
    command: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# long name -> (short, kind): int / str / flag / opt01 (an optional 0|1) / ignore-str /
# ignore-flag (accepted, not used: one warning) / quiet-str / quiet-flag (accepted silently)
OPTIONS: dict[str, tuple[str | None, str]] = {
    "ntasks": ("n", "int"),
    "nodes": ("N", "nodes"),
    "ntasks-per-node": (None, "int"),
    "cpus-per-task": ("c", "int"),
    "gpus-per-task": (None, "gpus"),
    "output": ("o", "str"),
    "error": ("e", "str"),
    "label": ("l", "flag"),
    "kill-on-bad-exit": ("K", "opt01"),
    "export": (None, "str"),
    "chdir": ("D", "str"),
    "overcommit": ("O", "flag"),
    "jobid": (None, "str"),
    "help": ("h", "flag"),
    "unbuffered": ("u", "flag"),
    "job-name": ("J", "quiet-str"),
    "mpi": (None, "mpi"),
    "cpu-bind": (None, "ignore-str"),
    "cpu_bind": (None, "ignore-str"),
    "gpu-bind": (None, "ignore-str"),
    "mem": (None, "ignore-str"),
    "mem-per-cpu": (None, "ignore-str"),
    "mem-per-gpu": (None, "ignore-str"),
    "mem-bind": (None, "ignore-str"),
    "gpus": ("G", "ignore-str"),
    "gres": (None, "ignore-str"),
    "gpus-per-node": (None, "ignore-str"),
    "cpus-per-gpu": (None, "ignore-str"),
    "distribution": ("m", "distribution"),
    "nodelist": ("w", "ignore-str"),
    "exclude": ("x", "ignore-str"),
    "time": ("t", "ignore-str"),
    "partition": ("p", "ignore-str"),
    "account": ("A", "ignore-str"),
    "qos": ("q", "ignore-str"),
    "constraint": ("C", "ignore-str"),
    "hint": (None, "ignore-str"),
    "threads-per-core": (None, "ignore-str"),
    "network": (None, "ignore-str"),
    "input": ("i", "ignore-str"),
    "wait": ("W", "ignore-str"),
    "exclusive": (None, "quiet-flag"),
    "overlap": (None, "quiet-flag"),
    "exact": (None, "quiet-flag"),
    "whole": (None, "quiet-flag"),
    "verbose": ("v", "quiet-flag"),
    "quiet": ("Q", "quiet-flag"),
    "pty": (None, "ignore-flag"),
}
SHORT = {short: long for long, (short, _kind) in OPTIONS.items() if short}
TAKES_VALUE = ("int", "str", "nodes", "gpus", "mpi", "distribution", "ignore-str", "quiet-str")
KNOWN_TEXT = "-n -N --ntasks-per-node -c --gpus-per-task -o -e -l -K --export -D -O -u --mpi"


def parse(args: Sequence[str], gpuq: bool = False, prog: str = "srun") -> SrunOptions:
    """InvalidInput (one line) for an unknown option, a bad value or no command."""
    options = SrunOptions()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, value, attached = _split(arg, prog)
        kind = OPTIONS[name][1]
        if kind in TAKES_VALUE and not attached:
            if i + 1 >= len(args):
                raise InvalidInput(f"{prog} --{name}", "", "needs a value")
            value = args[i + 1]
            i += 1
        elif kind == "opt01" and not attached and gpuq and i + 1 < len(args):
            if args[i + 1] in ("0", "1"):
                value = args[i + 1]
                i += 1
        elif kind.endswith("flag") and attached:
            raise InvalidInput(f"{prog} --{name}", value, "takes no value")
        _apply(options, name, kind, value, prog)
        i += 1
    options.command = list(args[i:])
    if not options.command and not options.help:
        raise InvalidInput(prog, " ".join(args), "no command to run (srun [options] CMD [ARGS])")
    return options


def _split(arg: str, prog: str) -> tuple[str, str | None, bool]:
    """(long name, value, whether the value was attached to the option itself)."""
    if arg.startswith("--"):
        name, eq, value = arg[2:].partition("=")
        if name not in OPTIONS:
            raise InvalidInput(
                prog, arg, f"not an option {prog} knows inside gpuq jobs (it knows {KNOWN_TEXT})"
            )
        return name, (value if eq else None), bool(eq)
    short = arg[1]
    if short not in SHORT:
        raise InvalidInput(
            prog, arg, f"not an option {prog} knows inside gpuq jobs (it knows {KNOWN_TEXT})"
        )
    rest = arg[2:]
    name = SHORT[short]
    kind = OPTIONS[name][1]
    if rest and kind.endswith("flag"):
        raise InvalidInput(prog, arg, "combined short options are not read; write them apart")
    if rest.startswith("=") and kind not in TAKES_VALUE:
        rest = rest[1:]
    return name, (rest or None), bool(rest)


def _apply(options: SrunOptions, name: str, kind: str, value: str | None, prog: str) -> None:
    flag = f"--{name}"
    if kind == "int":
        setattr(options, name.replace("-", "_"), _positive(flag, value))
    elif kind == "nodes":
        low, _, high = (value or "").partition("-")
        count = _positive(flag, low)
        if high and _positive(flag, high) != count:
            options.warnings.append(f"{prog}: warning: --nodes={value}: runs on {count} nodes")
        options.nodes = count
    elif kind == "gpus":
        text = (value or "").rpartition(":")[2]  # [TYPE:]G: the type is the job's
        try:
            options.gpus_per_task = int(text)
        except ValueError:
            raise InvalidInput(flag, value, "expected [TYPE:]COUNT") from None
        if options.gpus_per_task < 0:
            raise InvalidInput(flag, value, "expected [TYPE:]COUNT")
    elif kind == "str":
        if not value:
            raise InvalidInput(flag, value or "", "needs a value")
        setattr(options, name.replace("-", "_"), value)
    elif kind == "flag":
        setattr(options, name.replace("-", "_"), True)
    elif kind == "opt01":
        if value not in (None, "0", "1"):
            raise InvalidInput(flag, value, "expected 0 or 1")
        options.kill_on_bad_exit = value != "0"
    elif kind == "mpi":
        if value not in ("none", "pmix", "pmi2", "pmix_v3", "pmix_v4", "pmix_v5"):
            options.warnings.append(f"{prog}: warning: --mpi={value} is not used by gpuq's srun")
        elif value != "none":
            options.warnings.append(
                f"{prog}: warning: --mpi={value}: gpuq's srun starts no PMI server; "
                "use torch.distributed's MASTER_ADDR/MASTER_PORT or mpirun"
            )
    elif kind == "distribution":
        if (value or "").split(":")[0] not in ("block", "*"):
            options.warnings.append(
                f"{prog}: warning: --distribution={value}: gpuq's srun lays tasks out block-wise"
            )
    elif kind.startswith("ignore"):
        shown = f"{flag}={value}" if value is not None else flag
        options.warnings.append(f"{prog}: warning: {shown} is not used inside gpuq jobs")


def _positive(flag: str, value: str | None) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise InvalidInput(flag, value or "", "expected a whole number") from None
    if number < 1:
        raise InvalidInput(flag, value, "must be at least 1")
    return number


USAGE = """usage: srun [options] CMD [ARGS]...   (inside a gpuq job: one step over the job's nodes)
  -n, --ntasks N            tasks in all (default: the job's tasks on the nodes used)
  -N, --nodes N             the first N nodes of the job (default: all)
      --ntasks-per-node N   at most N tasks on a node
  -c, --cpus-per-task N     sets OMP_NUM_THREADS and SLURM_CPUS_PER_TASK
      --gpus-per-task G     each task sees its own G of its node's GPUs
  -o, --output PATTERN      output file(s): %t task, %n node index, %N node, %j job, %s step
  -e, --error PATTERN       stderr file(s), the same patterns (default: with --output)
  -l, --label               prefix each line with its task number
  -K, --kill-on-bad-exit[=0|1]  end the step and the job when a task fails (default 1)
      --export ALL|NONE|NAMES   the environment passed (default ALL)
  -D, --chdir DIR           the tasks' working folder
  -O, --overcommit          more tasks than the job's slots
"""
