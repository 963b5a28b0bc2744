"""The one table of submit options, OPTIONS: each option's name, flags and help.

The CLI builds `gpuq submit`'s flags from it, gpuq.directives reads `#GPUQ` lines with it and
gpuq.submission.build_spec takes its names as keywords, so `--gpus 2` means the same in all
three. Kept alone and light: the CLI imports it at start.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # the keyword of build_spec
    flags: tuple[str, ...]
    help: str
    metavar: str = ""
    multiple: bool = False
    is_flag: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "gpus",
        ("--gpus", "-G"),
        "whole GPUs for the job (with --nodes: in all, spread evenly); TYPE:N only of that "
        "model, e.g. a100:2 (see gpuq nodes)",
        "[TYPE:]N",
    ),
    Option(
        "gpu_mem",
        ("--gpu-mem",),
        "least memory each GPU must have, e.g. 40G; a card's marketed size fits it (80G: H100)",
        "SIZE",
    ),
    Option(
        "mig",
        ("--mig",),
        "one MIG slice of this profile instead of whole GPUs, e.g. 3g.71gb",
        "PROFILE",
    ),
    Option(
        "gpu_share",
        ("--gpu-share",),
        "a PCT% share (1-100) of one shared GPU (MPS) instead of whole GPUs; "
        "needs --gpu-mem SIZE, the share's VRAM limit",
        "PCT",
    ),
    Option(
        "nodelist",
        ("--nodelist", "-w"),
        "run only on one of these nodes, e.g. n1,n2 or n[1-4]",
        "NODES",
    ),
    Option("exclude", ("--exclude", "-x"), "never run on these nodes, e.g. n3 or n[5-6]", "NODES"),
    Option(
        "constraint",
        ("--constraint", "-C"),
        "node features: a&b (all), a|b (any); GPU types count, e.g. nvlink&a100",
        "FEATURES",
    ),
    Option(
        "partition",
        ("--partition", "-p"),
        "a partition ([partitions.NAME]; none configured: a node feature); P,Q: any of them",
        "P",
    ),
    Option(
        "gpus_per_node",
        ("--gpus-per-node",),
        "GPUs on each node of the job; for one node the same as --gpus",
        "[TYPE:]N",
    ),
    Option(
        "gpus_per_task",
        ("--gpus-per-task",),
        "GPUs for each task: each node gets N x its tasks, each task its own N",
        "[TYPE:]N",
    ),
    Option(
        "nodes",
        ("--nodes", "-N"),
        "run on N distinct nodes at once (all start together); GPUs, CPUs and --mem are per node",
        "N",
    ),
    Option(
        "ntasks",
        ("--ntasks", "-n"),
        "tasks a step (srun) runs, spread evenly over the nodes (default: one per node)",
        "N",
    ),
    Option("ntasks_per_node", ("--ntasks-per-node",), "tasks a step (srun) runs on each node", "N"),
    Option("cpus", ("--cpus", "-c"), "CPU cores per task (sets OMP_NUM_THREADS)", "N"),
    Option("cpus_per_task", ("--cpus-per-task",), "the same as --cpus", "N"),
    Option(
        "mem",
        ("--mem",),
        "host memory per node, e.g. 40G (bare number: MB); 0: all of each node's memory",
        "SIZE",
    ),
    Option("mem_per_gpu", ("--mem-per-gpu",), "host memory per GPU (instead of --mem)", "SIZE"),
    Option("mem_per_cpu", ("--mem-per-cpu",), "host memory per CPU (instead of --mem)", "SIZE"),
    Option(
        "exclusive",
        ("--exclusive",),
        "whole nodes: every GPU, CPU and byte of each node, shared with no other job",
        is_flag=True,
    ),
    Option(
        "time",
        ("--time", "-t"),
        "time limit, whole minutes (seconds round up): MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]",
        "TIME",
    ),
    Option(
        "name", ("--name", "-J", "--job-name"), "job name (default: the script's file name)", "NAME"
    ),
    Option(
        "output",
        ("--output", "-o"),
        "stdout file; sbatch's %j %J %A %a %x %u %N %s %%, %3a pads (default gpuq-%j.out)",
        "PATH",
    ),
    Option("error", ("--error", "-e"), "stderr file (default: into the output file)", "PATH"),
    Option("qos", ("--qos", "-q"), "QOS tier, e.g. high, normal, low", "QOS"),
    Option(
        "after",
        ("--after", "-d", "--dependency"),
        "start after JOB[:ok|any|notok], or afterok:JOB[:JOB...] (repeatable)",
        "DEP",
        multiple=True,
    ),
    Option("array", ("--array", "-a"), "array tasks, e.g. 0-99%8", "SPEC"),
    Option(
        "env", ("--env",), "set K=V in the job's environment (repeatable)", "K=V", multiple=True
    ),
    Option(
        "export",
        ("--export",),
        "ALL (default): carry your environment into the job; NONE: only --env",
        "ALL|NONE",
    ),
    Option("hold", ("--hold", "-H"), "submit held (gpuq release starts it)", is_flag=True),
    Option("nice", ("--nice",), "lower the job's priority by N", "N"),
    Option("begin", ("--begin", "-b"), "not before: 16:00, now+1h, 2026-12-01T09:00", "TIME"),
    Option("signal", ("--signal",), "warning signal SIG[@SECONDS] before a stop", "SIG@S"),
    Option("no_requeue", ("--no-requeue",), "do not requeue after a preemption", is_flag=True),
    Option("singleton", ("--singleton",), "one running job per user and name", is_flag=True),
    Option("chdir", ("--chdir", "-D"), "working folder (default: the current one)", "DIR"),
    Option(
        "mail_type",
        ("--mail-type",),
        "mail on BEGIN, END, FAIL, REQUEUE, TIME_LIMIT[_50|_80|_90], INVALID_DEPEND, "
        "ARRAY_TASKS, ALL or NONE, e.g. END,FAIL",
        "TYPES",
    ),
    Option("mail_user", ("--mail-user",), "who gets the mail (default: you)", "USER"),
    Option("notify", ("--notify",), "POST each state change as JSON to this http(s) URL", "URL"),
)
# options that say one thing in different units: a layer (the command line, `#GPUQ` lines,
# `#SBATCH` lines) gives at most one of each group (two only when they agree), and a later
# layer's choice replaces an earlier one's (`--gpus 2` on the command line overrides the
# script's `#SBATCH --gpus-per-node=8`)
GROUPS: tuple[tuple[str, ...], ...] = (
    ("gpus", "gpus_per_node", "gpus_per_task"),
    ("cpus", "cpus_per_task"),
    ("mem", "mem_per_gpu", "mem_per_cpu"),
)
GROUP_OF = {name: group for group in GROUPS for name in group}
BY_FLAG = {flag: option for option in OPTIONS for flag in option.flags}
BY_NAME = {option.name: option for option in OPTIONS}


def long_matches(flag: str, flags: Mapping[str, Hashable]) -> tuple[str, ...]:
    """The long options `flag` names, as getopt_long reads it (sbatch parses with it): an exact
    match, or every option it is a prefix of, one per meaning (`flags` maps each long flag to
    its meaning, so two spellings of one option are not ambiguous). One: that option; none:
    unknown; more: ambiguous (see `ambiguous`)."""
    if flag in flags:
        return (flag,)
    found: dict[Hashable, str] = {}
    for candidate in flags:
        if candidate.startswith(flag) and len(flag) > 2:
            found.setdefault(flags[candidate], candidate)
    return tuple(found.values())


def ambiguous(flag: str, candidates: tuple[str, ...]) -> str:
    """getopt_long's refusal of a prefix of several options, as one line."""
    return f"{flag} is ambiguous: {', '.join(sorted(candidates))}"


# `gpuq submit`'s long flags, by meaning: what a prefix (`--part`, `--err`) is matched against
SUBMIT_MEANINGS: dict[str, Hashable] = {
    **{flag: o.name for o in OPTIONS for flag in o.flags if flag.startswith("--")},
    "--wrap": "wrap",
    "--wait": "wait",
    "--parsable": "parsable",
    "--help": "help",
}
# the long flags of `gpuq submit`: after the script they are the script's arguments (warned)
SUBMIT_LONG_FLAGS = frozenset(SUBMIT_MEANINGS) - {"--help"}
_SUBMIT_FLAGS_ALONE = frozenset(
    {"--wait", "-W", "--parsable", "--help", "-h"}
    | {flag for option in OPTIONS if option.is_flag for flag in option.flags}
)


def resolve_submit_args(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """`gpuq submit`'s words with each long option's prefix written out (`--part gpu` is
    `--partition gpu`), up to the script (what follows is the script's own), and how each
    option was written (`{"partition": "-p"}`), for errors to name it so. ValueError (one
    line) for an ambiguous prefix."""
    out: list[str] = []
    spelled: dict[str, str] = {}
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if word == "--" or not word.startswith("-") or word == "-":
            return [*out, word, *args[index:]], spelled
        flag, eq, value = word.partition("=") if word.startswith("--") else (word[:2], "", "")
        if flag.startswith("--"):
            found = long_matches(flag, SUBMIT_MEANINGS)
            if len(found) > 1:
                raise ValueError(ambiguous(flag, found))
            flag = found[0] if found else flag
            word = flag + eq + value
        out.append(word)
        option = BY_FLAG.get(flag)
        if option is not None:
            spelled[option.name] = flag
        alone = eq or len(word) > len(flag) or flag in _SUBMIT_FLAGS_ALONE
        if not alone and index < len(args):  # its value, whatever it looks like
            out.append(args[index])
            index += 1
    return out, spelled
