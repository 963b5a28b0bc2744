"""sbatch's own option table, for reading `#SBATCH` lines exactly as sbatch reads them.

sbatch parses its options with getopt_long, so a long option may be any unambiguous prefix
(`--err` is `--error`) and one it does not know is an error, not something to skip. This is
its table (SLURM 25.x, `src/common/slurm_opt.c`, the options sbatch takes), with what gpuq
does with each one it uses (USED); gpuq.directives reads the lines with it, and the README's
table of `#SBATCH` support is made from it (`support_table`, checked by a test).
"""

from __future__ import annotations

from collections.abc import Hashable

NONE, REQUIRED, OPTIONAL = "none", "required", "optional"  # getopt's has_arg

_NO_VALUE = """
consolidate-segments contiguous external get-user-env help hold ignore-pbs no-requeue
overcommit oversubscribe parsable quiet reboot spread-job spread-segments stepmgr test-only
usage use-min-nodes verbose version wait
"""
_OPTIONAL_VALUE = "exclusive nice no-kill oom-kill-step propagate requeue resv-ports"
_VALUE = """
account acctg-freq array autocomplete batch bb bbf begin chdir cluster cluster-constraint
clusters comment constraint container container-id context core-spec cores-per-socket cpu-freq
cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution error exclude export
export-file extra extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses mail-type
mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mem-update mincpus network nodefile
nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
ntasks-per-tres open-mode output partition prefer priority profile qos reservation resources
runtime segment signal sockets-per-node switches tasks-per-node thread-spec threads-per-core
time time-min tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap
"""
# every long option of sbatch -> whether it takes a value
LONG: dict[str, str] = {
    **dict.fromkeys(_VALUE.split(), REQUIRED),
    **dict.fromkeys(_OPTIONAL_VALUE.split(), OPTIONAL),
    **dict.fromkeys(_NO_VALUE.split(), NONE),
}
# sbatch's short options -> their long option
SHORT: dict[str, str] = {
    "A": "account",
    "B": "extra-node-info",
    "C": "constraint",
    "D": "chdir",
    "F": "nodefile",
    "G": "gpus",
    "H": "hold",
    "J": "job-name",
    "L": "licenses",
    "M": "clusters",
    "N": "nodes",
    "O": "overcommit",
    "Q": "quiet",
    "S": "core-spec",
    "V": "version",
    "W": "wait",
    "a": "array",
    "b": "begin",
    "c": "cpus-per-task",
    "d": "dependency",
    "e": "error",
    "h": "help",
    "i": "input",
    "k": "no-kill",
    "m": "distribution",
    "n": "ntasks",
    "o": "output",
    "p": "partition",
    "q": "qos",
    "s": "oversubscribe",
    "t": "time",
    "v": "verbose",
    "w": "nodelist",
    "x": "exclude",
}
SAME = {"tasks-per-node": "ntasks-per-node"}  # two names of one option (never ambiguous)
# the meaning of each long flag, for getopt's prefix rule (gpuq.options.long_matches)
MEANINGS: dict[str, Hashable] = {f"--{name}": SAME.get(name, name) for name in LONG}
# options sbatch once took and now refuses, which old scripts still carry: what to write
REMOVED = {
    "workdir": "sbatch renamed it --chdir (-D)",
    "share": "sbatch renamed it --oversubscribe",
    "checkpoint": "sbatch no longer checkpoints",
    "checkpoint-dir": "sbatch no longer checkpoints",
}


# the sbatch options gpuq uses -> (the gpuq option it sets, what gpuq makes of it); WAIT is
# `gpuq submit --wait`, not an option of the job
WAIT = "wait"
USED: dict[str, tuple[str, str]] = {
    "gpus": ("gpus", "GPUs in all, spread evenly over the nodes; `TYPE:N`, `TYPE` (one)"),
    "gpus-per-node": ("gpus_per_node", "GPUs on each node; `TYPE:N`, `TYPE` (one)"),
    "gres": ("gpus_per_node", "`gpu:N`, `gpu:TYPE:N`, `gpu:TYPE` (one), per node; others warned"),
    "gpus-per-task": ("gpus_per_task", "GPUs for each task; `TYPE:N`, `TYPE` (one)"),
    "nodes": ("nodes", "nodes (one count, not a range)"),
    "ntasks": ("ntasks", "tasks of a step"),
    "ntasks-per-node": ("ntasks_per_node", "tasks of a step on each node"),
    "cpus-per-task": ("cpus", "CPU cores per task"),
    "mem": ("mem", "memory per node; `0`: all of it"),
    "mem-per-gpu": ("mem_per_gpu", "memory per GPU"),
    "mem-per-cpu": ("mem_per_cpu", "memory per CPU"),
    "exclusive": ("exclusive", "whole nodes (`=user`, `=mcs`, `=topo`: the same, warned)"),
    "time": (
        "time",
        "time limit, whole minutes (seconds round up); no limit (`UNLIMITED`, `0`, `-1`) warned",
    ),
    "job-name": ("name", "job name"),
    "output": ("output", "stdout file (patterns below)"),
    "error": ("error", "stderr file (patterns below); without it stderr goes to --output"),
    "qos": ("qos", "QOS tier"),
    "array": ("array", "array tasks"),
    "dependency": ("after", "`afterok`, `afterany`, `afternotok`, `singleton`"),
    "hold": ("hold", "submit held"),
    "begin": ("begin", "not before"),
    "signal": ("signal", "warning signal (`B:`, `R:` warned)"),
    "no-requeue": ("no_requeue", "never requeued after a preemption"),
    "chdir": ("chdir", "working folder"),
    "nice": ("nice", "lower priority (100 without a value)"),
    "export": ("export", "`ALL` or `NONE`, then `K=V` items; others warned"),
    "nodelist": ("nodelist", "only these nodes (any of them)"),
    "exclude": ("exclude", "never these nodes"),
    "constraint": ("constraint", "node features"),
    "partition": ("partition", "the partition, as `gpuq submit -p`"),
    "mail-type": ("mail_type", "mail on these events"),
    "mail-user": ("mail_user", "who gets the mail"),
    "wait": (WAIT, "`gpuq submit` waits for the job, as `--wait` does"),
}
QUIET = frozenset({"requeue"})  # what gpuq does anyway: neither used nor warned


def support_table() -> str:
    """The README's table of `#SBATCH` support (a test checks it is the README's)."""
    short_of = {long: short for short, long in SHORT.items()}
    rows = ["| sbatch option | gpuq |", "|---|---|"]
    for long, (_, meaning) in USED.items():
        short = f" (`-{short_of[long]}`)" if long in short_of else ""
        rows.append(f"| `--{long}`{short} | {meaning} |")
    return "\n".join(rows) + "\n"
