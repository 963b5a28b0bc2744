"""squeue, sacct and sinfo on gpuq (gpuq.slurm): the listings of gpuq.client, printed in
SLURM's forms (gpuq.slurm.formats) with SLURM's words, so that what parses SLURM's output
parses these."""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuq.slurm.arguments import Refused, context, given, last, options, split_list, values
from gpuq.slurm.formats import (
    LONG_STATE,
    SHORT_STATE,
    Field,
    cell,
    exit_code_text,
    parse_names,
    parse_percent,
    parse_states,
    percent_line,
    slurm_duration,
    slurm_time,
)

# the one partition SLURM's tools see on a site without [partitions.NAME]
DEFAULT_PARTITION = "gpuq"


def partition(job: Any) -> str:
    """The job's partitions as squeue shows them (`debug`, `debug,gpu`), or gpuq's one where
    the site has none."""
    return ",".join(job.spec.placement.partitions) or DEFAULT_PARTITION


def node_partitions(node: Any) -> list[str]:
    """A node's partitions (the config's order), or gpuq's one where the site has none."""
    return list(node.partitions) or [DEFAULT_PARTITION]


def marked_partitions(node: Any) -> str:
    """sinfo's %P: the default partition marked with `*`."""
    default = node.default_partition or (DEFAULT_PARTITION if not node.partitions else "")
    return ",".join(p + ("*" if p == default else "") for p in node_partitions(node))


def reason_word(job: Any) -> str:
    """squeue's reason, in SLURM's words (scripts test for `Dependency`, `JobHeldUser`)."""
    if job.state == "held":
        return "JobHeldUser"
    if job.state != "pending":
        return "None"
    reasons = list(job.pending.reasons) if job.HasField("pending") else []
    first = reasons[0].lower() if reasons else ""
    for start, word in REASON_WORDS:
        if first.startswith(start):
            return word
    return "Resources" if reasons else "Priority"


REASON_WORDS = (
    ("dependency", "Dependency"),
    ("begin", "BeginTime"),
    ("not before", "BeginTime"),
    ("qos", "QOSResourceLimit"),
    ("priority", "Priority"),
    ("singleton", "Dependency"),
    ("resources reserved", "Resources"),
)


def tres(job: Any) -> str:
    """AllocTRES / scontrol's TRES: `cpu=4,mem=40G,node=1,gres/gpu=2`."""
    from gpuq.cli.render import node_count, size, total_gpus

    res = job.spec.resources
    nodes = node_count(res)
    parts = [f"cpu={res.cpus * nodes}"]
    if res.HasField("mem"):
        parts.append(f"mem={size(res.mem * nodes)}")
    parts.append(f"node={nodes}")
    if gpus := total_gpus(res):
        parts.append(f"gres/gpu={gpus}")
    return ",".join(parts)


def _when(job: Any, field: str, missing: str) -> str:
    return slurm_time(getattr(job, field) if job.HasField(field) else None, missing)


# ---- squeue --------------------------------------------------------------------------------

SQUEUE_CODES = {
    "i": "JOBID",
    "A": "JOBID",
    "F": "ARRAY_JOB_ID",
    "K": "ARRAY_TASK_ID",
    "j": "NAME",
    "u": "USER",
    "T": "STATE",
    "t": "ST",
    "M": "TIME",
    "l": "TIME_LIMIT",
    "D": "NODES",
    "R": "NODELIST(REASON)",
    "r": "REASON",
    "P": "PARTITION",
    "N": "NODELIST",
    "C": "CPUS",
    "b": "TRES_PER_NODE",
    "S": "START_TIME",
    "V": "SUBMIT_TIME",
    "e": "END_TIME",
    "Q": "PRIORITY",
    "q": "QOS",
    "m": "MIN_MEMORY",
}
# squeue -O's names -> the % code that prints the same
SQUEUE_NAMES = {
    "JobID": "i",
    "JobArrayID": "i",
    "ArrayJobID": "F",
    "ArrayTaskID": "K",
    "Name": "j",
    "UserName": "u",
    "State": "T",
    "StateCompact": "t",
    "TimeUsed": "M",
    "TimeLimit": "l",
    "NumNodes": "D",
    "ReasonList": "R",
    "Reason": "r",
    "Partition": "P",
    "NodeList": "N",
    "NumCPUs": "C",
    "tres-per-node": "b",
    "StartTime": "S",
    "SubmitTime": "V",
    "EndTime": "e",
    "Priority": "Q",
    "QOS": "q",
    "MinMemory": "m",
}
SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
SQUEUE_LONG = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"


def squeue_value(job: Any, code: str, now: float) -> str:
    """One squeue field of `job`, in SLURM's words (not yet escaped)."""
    from gpuq.cli.render import gres, job_id_text, node_count, node_text, size

    res = job.spec.resources
    waiting = job.state in ("pending", "held")
    started = job.start_time if job.HasField("start_time") else None
    values: dict[str, Callable[[], object]] = {
        "i": lambda: job_id_text(job),
        "A": lambda: job.id,
        "F": lambda: job.array_job_id if job.HasField("array_job_id") else job.id,
        "K": lambda: (
            job.array_tasks or job.array_task_id if job.HasField("array_job_id") else "N/A"
        ),
        "j": lambda: job.spec.name,
        "u": lambda: job.user,
        "T": lambda: LONG_STATE.get(job.state, job.state.upper()),
        "t": lambda: SHORT_STATE.get(job.state, job.state.upper()),
        "M": lambda: slurm_duration(now - started if started else 0, compact=True),
        "l": lambda: (
            slurm_duration(res.time_limit, compact=True)
            if res.HasField("time_limit")
            else "UNLIMITED"
        ),
        "D": lambda: node_count(res),
        "R": lambda: f"({reason_word(job)})" if waiting else node_text(job),
        "r": lambda: reason_word(job),
        "P": lambda: partition(job),
        "N": lambda: "" if waiting else node_text(job),
        "C": lambda: res.cpus * node_count(res),
        "b": lambda: "N/A" if gres(job) == "-" else gres(job),
        "S": lambda: (
            _when(job.pending, "estimated_start", "N/A")
            if waiting and job.HasField("pending")
            else _when(job, "start_time", "N/A")
        ),
        "V": lambda: slurm_time(job.submit_time or None, "N/A"),
        "e": lambda: (
            slurm_time(started + res.time_limit)
            if started and res.HasField("time_limit")
            else _when(job, "end_time", "N/A")
        ),
        "Q": lambda: job.priority,
        "q": lambda: job.qos,
        "m": lambda: size(res.mem) if res.HasField("mem") else "0",
    }
    return str(values[code]())


def squeue_format(fmt: str | None, fields: str | None, long_: bool) -> list[str | Field]:
    """-o (%-codes) or -O (names, each 20 wide unless given) as one %-format's parts."""
    if fields is not None:
        parts: list[str | Field] = []
        for field in parse_names(fields, SQUEUE_NAMES, width_mark=":", default_width=20):
            parts.append(Field(SQUEUE_NAMES[field.key], field.width, field.right, field.suffix))
        return parts
    return parse_percent(fmt or (SQUEUE_LONG if long_ else SQUEUE_DEFAULT), SQUEUE_CODES)


def squeue(argv: Sequence[str]) -> int:
    """`squeue [-u USERS] [-j IDS] [-t STATES] [-n NAMES] [-w NODES] [-p PART] [-h]
    [-o FMT | -O FIELDS] [-l] [-r] [--me]`."""
    pairs, rest = options(
        "squeue",
        argv,
        "u:j:t:n:w:p:o:O:hlraq:",
        [
            *("user=", "users=", "jobs=", "job=", "states=", "state=", "name=", "nodelist="),
            *("partition=", "format=", "Format=", "noheader", "long", "array", "all", "me"),
            *("qos=", "sort=", "nodes="),
        ],
    )
    if rest:
        raise Refused(f"error: unrecognized argument {rest[0]!r}")
    parts = squeue_format(
        last(pairs, "-o", "--format"), last(pairs, "-O", "--Format"), given(pairs, "-l", "--long")
    )
    users = split_list(values(pairs, "-u", "--user", "--users"))
    if given(pairs, "--me"):
        users.append(getpass.getuser())
    live = ("pending", "held", "running")
    asked = values(pairs, "-t", "--states", "--state")
    states = parse_states(asked) if asked else frozenset(live)
    ids = split_list(values(pairs, "-j", "--jobs", "--job"))
    client = context().client()
    filters = {
        "users": users,
        "names": split_list(values(pairs, "-n", "--name")),
        "nodes": split_list(values(pairs, "-w", "--nodelist", "--nodes")),
    }
    if ids:
        jobs = jobs_by_ids(client, ids, **filters)
    else:
        jobs = client.list_raw(expand_arrays=given(pairs, "-r", "--array"), **filters)
    # live jobs only, ended ones asked for by id too (sacct lists those, as SLURM's does
    # once they are old)
    jobs = [j for j in jobs if j.state in live and j.state in states]
    jobs = [j for j in jobs if names_job(j, ids) and _in_partitions(j, pairs)]
    qos = split_list(values(pairs, "-q", "--qos"))
    jobs = [j for j in jobs if not qos or j.qos in qos]
    now = time.time()
    if not given(pairs, "-h", "--noheader"):
        print(percent_line(parts, {f.key: SQUEUE_CODES[f.key] for f in _fields(parts)}))
    for job in jobs:
        print(
            _escaped(
                percent_line(parts, {f.key: squeue_value(job, f.key, now) for f in _fields(parts)})
            )
        )
    return 0


def _fields(parts: Sequence[str | Field]) -> list[Field]:
    return [p for p in parts if isinstance(p, Field)]


def jobs_by_ids(client: Any, ids: Sequence[str], **filters: Any) -> list[Any]:
    """The jobs `ids` name, in any state, that match `filters` (list_raw's): an array's id
    names each of its tasks, as in SLURM (`40` is 40_0, 40_1...; `40_3` one task)."""
    from gpuq.domain.dependencies import parse_job_ref

    numbers = sorted({parse_job_ref(i)[0] for i in ids})
    found = {j.id: j for j in client.list_raw(job_ids=numbers, **filters)}
    arrays = sorted({j.array_job_id for j in found.values() if j.HasField("array_job_id")})
    for array in arrays:
        found.update((j.id, j) for j in client.list_raw(array_job_id=array, **filters))
    return [found[k] for k in sorted(found) if names_job(found[k], ids)]


def names_job(job: Any, ids: Sequence[str]) -> bool:
    """Whether `job` is one of `ids` (`40` is the whole array 40, `40_3` one task)."""
    from gpuq.cli.render import job_id_text

    if not ids:
        return True
    names = {job_id_text(job), str(job.id)}
    if job.HasField("array_job_id"):
        names.add(str(job.array_job_id))
    return bool(names & set(ids))


def _in_partitions(job: Any, pairs: Sequence[tuple[str, str]]) -> bool:
    wanted = split_list(values(pairs, "-p", "--partition"))
    return not wanted or bool(set(wanted) & set(partition(job).split(",")))


def _escaped(line: str) -> str:
    from gpuq.cli.render import printable

    return printable(line)


# ---- sacct ---------------------------------------------------------------------------------

SACCT_WIDTHS = {
    "JobID": 12,
    "JobIDRaw": 12,
    "JobName": 10,
    "State": 10,
    "ExitCode": 8,
    "Elapsed": 10,
    "ElapsedRaw": 10,
    "Start": 19,
    "End": 19,
    "Submit": 19,
    "NodeList": 15,
    "NNodes": 8,
    "AllocCPUS": 10,
    "NCPUS": 10,
    "AllocTRES": 10,
    "AllocGRES": 12,
    "User": 9,
    "Partition": 10,
    "Account": 10,
    "Timelimit": 10,
    "QOS": 10,
    "Reason": 20,
    "WorkDir": 20,
}
SACCT_DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
SACCT_BRIEF = "JobID,State,ExitCode"


def sacct_value(job: Any, name: str, now: float) -> str:
    """One sacct field of `job`, in SLURM's words."""
    from gpuq.cli.render import gres, job_id_text, node_count, node_text

    res = job.spec.resources
    started = job.start_time if job.HasField("start_time") else None
    ended = job.end_time if job.HasField("end_time") else None
    result = job.result if job.HasField("result") else None
    run = ((ended or now) - started) if started is not None else 0
    values: dict[str, Callable[[], object]] = {
        "JobID": lambda: job_id_text(job),
        "JobIDRaw": lambda: job.id,
        "JobName": lambda: job.spec.name,
        "State": lambda: LONG_STATE.get(job.state, job.state.upper()),
        "ExitCode": lambda: exit_code_text(
            result.exit_code if result and result.HasField("exit_code") else None,
            result.signal if result and result.HasField("signal") else None,
        ),
        "Elapsed": lambda: slurm_duration(run),
        "ElapsedRaw": lambda: int(run),
        "Start": lambda: slurm_time(started),
        "End": lambda: slurm_time(ended),
        "Submit": lambda: slurm_time(job.submit_time or None),
        "NodeList": lambda: node_text(job) or "None assigned",
        "NNodes": lambda: node_count(res),
        "AllocCPUS": lambda: res.cpus * node_count(res) if started is not None else 0,
        "NCPUS": lambda: res.cpus * node_count(res),
        "AllocTRES": lambda: tres(job) if started is not None else "",
        "AllocGRES": lambda: "" if gres(job) == "-" else gres(job),
        "User": lambda: job.user,
        "Partition": lambda: partition(job),
        "Account": lambda: "",
        "Timelimit": lambda: (
            slurm_duration(res.time_limit) if res.HasField("time_limit") else "UNLIMITED"
        ),
        "QOS": lambda: job.qos,
        "Reason": lambda: reason_word(job),
        "WorkDir": lambda: job.spec.workdir,
    }
    return str(values[name]())


def sacct(argv: Sequence[str]) -> int:
    """`sacct [-j IDS] [-u USERS | -a] [-s STATES] [-S T] [-E T] [--name NAMES] [-o FIELDS]
    [-b] [-P | -p] [-n] [-X]`: a job's line only (gpuq keeps no per-step records, so -X
    changes nothing)."""
    pairs, rest = options(
        "sacct",
        argv,
        "j:u:s:S:E:o:PpnXabDL",
        [
            *("jobs=", "user=", "uid=", "state=", "starttime=", "endtime=", "format="),
            *("parsable2", "parsable", "noheader", "allocations", "allusers", "brief"),
            *("name=", "duplicates", "allclusters"),
        ],
    )
    if rest:
        raise Refused(f"error: unrecognized argument {rest[0]!r}")
    names = last(pairs, "-o", "--format") or (
        SACCT_BRIEF if given(pairs, "-b", "--brief") else SACCT_DEFAULT
    )
    fields = parse_names(names, SACCT_WIDTHS, width_mark="%", default_width=SACCT_WIDTHS)
    now = time.time()
    jobs = _sacct_jobs(pairs, now)
    separator = "|" if given(pairs, "-P", "--parsable2", "-p", "--parsable") else None
    trail = "|" if given(pairs, "-p", "--parsable") else ""

    def line(cells: Sequence[str]) -> str:
        if separator is not None:
            return separator.join(cells) + trail
        return " ".join(cell(c, f, cut_mark="+") for c, f in zip(cells, fields, strict=True)) + " "

    if not given(pairs, "-n", "--noheader"):
        print(line([f.key for f in fields]))
        if separator is None:
            print(" ".join("-" * (f.width or 0) for f in fields) + " ")
    for job in jobs:
        print(_escaped(line([sacct_value(job, f.key, now) for f in fields])))
    return 0


def _sacct_jobs(pairs: Sequence[tuple[str, str]], now: float) -> list[Any]:
    """The jobs sacct lists: live and ended, by id. Without -j, as SLURM: the caller's own
    (-u, -a: others) since midnight (-S: since then) by their end, and every live one."""
    from gpuq.cli.listings import parse_since

    ids = split_list(values(pairs, "-j", "--jobs"))
    users = split_list(values(pairs, "-u", "--user", "--uid"))
    if not ids and not users and not given(pairs, "-a", "--allusers"):
        users = [getpass.getuser()]
    start_text, end_text = last(pairs, "-S", "--starttime"), last(pairs, "-E", "--endtime")
    since = parse_since(start_text, now, "-S") if start_text else None
    if since is None and not ids:
        since = time.mktime((*time.localtime(now)[:3], 0, 0, 0, 0, 0, -1))
    until = parse_since(end_text, now, "-E") if end_text else None
    states = parse_states(values(pairs, "-s", "--state"))
    live_states = {s for s in states if s in ("pending", "held", "running")}
    ended_states = states - live_states
    filters = {"users": users, "names": split_list(values(pairs, "--name"))}
    client = context().client()
    if ids:
        picked = jobs_by_ids(client, ids, since=since, until=until, **filters)
        return [j for j in picked if not states or j.state in states]
    jobs: dict[int, Any] = {}
    if not states or ended_states:
        for job in client.list_raw(
            states=sorted(ended_states), finished=True, since=since, until=until, **filters
        ):
            jobs[job.id] = job
    if not states or live_states:
        for job in client.list_raw(states=sorted(live_states), expand_arrays=True, **filters):
            jobs[job.id] = job
    return [jobs[k] for k in sorted(jobs)]


# ---- sinfo ---------------------------------------------------------------------------------

SINFO_CODES = {
    "N": "NODELIST",
    "n": "HOSTNAMES",
    "P": "PARTITION",
    "R": "PARTITION",
    "T": "STATE",
    "t": "STATE",
    "G": "GRES",
    "c": "CPUS",
    "m": "MEMORY",
    "e": "FREE_MEM",
    "D": "NODES",
    "a": "AVAIL",
    "l": "TIMELIMIT",
    "C": "CPUS(A/I/O/T)",
    "f": "AVAIL_FEATURES",
    "E": "REASON",
}
SINFO_DEFAULT = "%9P %.5a %.10l %.6D %.6t %N"
SINFO_NODES = "%10N %.6D %9P %6t"
SHORT_NODE_STATE = {
    "idle": "idle",
    "mixed": "mix",
    "allocated": "alloc",
    "drained": "drain",
    "draining": "drng",
    "down": "down",
}


def node_state(node: Any) -> str:
    """A node's state in SLURM's words: idle, mixed, allocated, draining, drained, down."""
    if node.state != "up":
        return "down"
    busy = bool(node.running_jobs)
    if node.drain_reason:
        return "draining" if busy else "drained"
    if not busy:
        return "idle"
    gpus_full = bool(node.gpus) and len(set(node.gpus_used)) >= len(node.gpus)
    cpus_full = bool(node.cpus) and node.cpus_used >= node.cpus
    return "allocated" if gpus_full or cpus_full else "mixed"


def node_gres(node: Any) -> str:
    """sinfo's %G: `gpu:a100:4`, one item per GPU model; `(null)` without GPUs."""
    from gpuq.domain.gpu_types import gpu_type

    counts: dict[str, int] = {}
    for gpu in node.gpus:
        kind = gpu_type(gpu.name)
        counts[kind] = counts.get(kind, 0) + 1
    return ",".join(f"gpu:{k}:{n}" for k, n in sorted(counts.items())) or "(null)"


def sinfo_value(nodes: Sequence[Any], code: str) -> str:
    """One sinfo field of a group of nodes (one node with -N) that share a state."""
    from gpuq.domain.node_constraints import compress_nodes

    node = nodes[0]
    mib = 1 << 20
    state = node_state(node)
    values: dict[str, Callable[[], object]] = {
        "N": lambda: compress_nodes(n.name for n in nodes),
        "n": lambda: ",".join(n.name for n in nodes),
        "P": lambda: marked_partitions(node),
        "R": lambda: ",".join(node_partitions(node)),
        "T": lambda: state,
        "t": lambda: SHORT_NODE_STATE[state],
        "G": lambda: node_gres(node),
        "c": lambda: node.cpus,
        "m": lambda: node.mem // mib,
        "e": lambda: max(0, node.mem - node.mem_used) // mib,
        "D": lambda: len(nodes),
        "a": lambda: "up",
        "l": lambda: "infinite",
        "C": lambda: _cpus(nodes),
        "f": lambda: ",".join(node.features) or "(null)",
        "E": lambda: node.drain_reason or node.reason or "none",
    }
    return str(values[code]())


def _cpus(nodes: Sequence[Any]) -> str:
    used = sum(n.cpus_used for n in nodes if n.state == "up")
    other = sum(n.cpus for n in nodes if n.state != "up" or n.drain_reason)
    total = sum(n.cpus for n in nodes)
    return f"{used}/{max(0, total - used - other)}/{other}/{total}"


def sinfo(argv: Sequence[str]) -> int:
    """`sinfo [-N] [-o FMT] [-h] [-p PART] [-n NODES]`: nodes by state (-N: one a line)."""
    from gpuq.domain.node_constraints import expand_nodes

    pairs, rest = options(
        "sinfo",
        argv,
        "No:hp:n:a",
        ["Node", "format=", "noheader", "partition=", "nodes=", "all"],
    )
    if rest:
        raise Refused(f"error: unrecognized argument {rest[0]!r}")
    per_node = given(pairs, "-N", "--Node")
    parts = parse_percent(
        last(pairs, "-o", "--format") or (SINFO_NODES if per_node else SINFO_DEFAULT), SINFO_CODES
    )
    wanted = {n for text in values(pairs, "-n", "--nodes") for n in expand_nodes(text, "--nodes")}
    partitions = split_list(values(pairs, "-p", "--partition"))
    nodes = sorted(context().client().nodes(), key=lambda n: n.name)
    nodes = [n for n in nodes if not wanted or n.name in wanted]
    if partitions:
        nodes = [n for n in nodes if set(partitions) & set(node_partitions(n))]
    groups: list[list[Any]] = [[n] for n in nodes]
    if not per_node:
        by_state: dict[str, list[Any]] = {}
        for node in nodes:
            key = (
                f"{node_state(node)} {marked_partitions(node)}"  # one line per state and partitions
            )
            by_state.setdefault(key, []).append(node)
        groups = list(by_state.values())
    if not given(pairs, "-h", "--noheader"):
        print(percent_line(parts, {f.key: SINFO_CODES[f.key] for f in _fields(parts)}))
    for group in groups:
        print(
            _escaped(
                percent_line(parts, {f.key: sinfo_value(group, f.key) for f in _fields(parts)})
            )
        )
    return 0
