"""Why a job ended as it did: ranked verdicts from the evidence gpuq holds, each with its
evidence lines and a next step (`gpuq diagnose`, `gpuq show`, the dashboard).

The evidence: the job's end state and result, its events and their causes, what it asked
for (--mem, --time, a MIG slice or share), what its agents measured (peak host memory, GPU
telemetry), the coordinator's flags on a running job, and the tail of its output that each
node's agent sent with the end of a job that did not complete. Structured evidence is read by
the rules here (a cgroup OOM kill, an XID on its GPU, a rank that failed first, the time limit
with the job's own measured rate, idle GPUs, a signal, a preemption, a node failure, a launch
failure); the output by the signatures of gpuq.domain.log_signatures, which admins extend.

The verdicts come ranked (heaviest first); the first is "the" verdict. Pure: no I/O. Computed
on demand, so a signature an admin adds applies to past jobs too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuq.domain.log_signatures import (
    Finding,
    Signature,
    find_signatures,
    last_traceback,
    quote,
    tail_lines,
    torch_oom,
)
from gpuq.domain.model import Job, JobEvent
from gpuq.domain.progress import Progress, latest_progress
from gpuq.domain.states import JobState
from gpuq.domain.units import format_duration, format_size
from gpuq.domain.xids import is_hardware_xid, xid_advice, xid_text, xids_in

GIB = 1 << 30
IDLE_P95 = 5.0  # percent: GPUs below this at the 95th percentile sat idle
INPUT_BOUND_MEAN = 40.0  # percent: GPUs below this on average while the job made progress
MIN_MEASURED = 60.0  # seconds of GPU samples before idle GPUs say anything
LARGE_UNALLOCATED = 0.2  # share of the reserved memory free but fragmented: large
TIME_MARGIN = 1.2  # a suggested --time: the measured need and a fifth more
_RANK_FIRST = re.compile(
    r"\btask (?P<rank>\d+) on (?P<node>\S+) (?P<what>.+?) at \d\d:\d\d:\d\d"
    r"(?:; (?P<stopped>tasks? [\d,-]+ (?:was|were) stopped))?"
)
_SIGNALS = {
    6: (
        "aborted",
        45,
        "SIGABRT",
        "it aborted itself: a failed assertion, an uncaught C++ "
        "exception or a library's fatal error (NCCL's async error handling aborts): the last "
        "lines of its output say which",
    ),
    7: (
        "bus-error",
        45,
        "SIGBUS",
        "often /dev/shm full (DataLoader workers share batches "
        "there: fewer workers, or smaller batches) or a memory-mapped file truncated under it",
    ),
    9: (
        "killed",
        40,
        "SIGKILL",
        "not by gpuq's own limits (they end a job out_of_memory or "
        "timeout): the kernel's OOM killer outside the job's memory limit (the node's "
        "`dmesg` says), or someone's `kill -9`",
    ),
    11: (
        "segfault",
        50,
        "SIGSEGV",
        "a crash in native code (a C extension, a CUDA "
        "library): run it with `python -X faulthandler` or under gdb; mismatched CUDA, NCCL "
        "or PyTorch builds are a common cause",
    ),
    15: (
        "terminated",
        30,
        "SIGTERM",
        "something asked it to stop: look at who (the events' causes) or its own scripts",
    ),
}


@dataclass(frozen=True, slots=True)
class EndEvidence:
    """What one node's agent sent with the end of a start of a job, kept with the job: the
    most host memory its processes held (bytes; 0: unknown) and the tail of its output (stdout,
    then stderr when separate; "" when none was sent: a completed job, or nothing readable)."""

    node: str
    attempt: int
    peak_mem: int = 0
    output_tail: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything a diagnosis reads. `ends`: those of the job's latest start (the first node
    first); `time_limit`: the limit it ran under, in seconds (its QOS's default included);
    `flags`: the coordinator's notes on a running job (idle, possibly hung)."""

    job: Job
    events: tuple[JobEvent, ...] = ()
    ends: tuple[EndEvidence, ...] = ()
    time_limit: float | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """One finding: a short name ("host-oom"), a one-line title, the evidence lines that
    support it, the suggested next step, and its weight (verdicts rank by it)."""

    name: str
    title: str
    evidence: tuple[str, ...] = ()
    advice: str = ""
    weight: int = 0


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A job's verdicts, ranked (the first is the verdict; none: nothing to say), and what the
    diagnosis could not read (e.g. "its output is private to its owner and admins")."""

    verdicts: tuple[Verdict, ...] = ()
    note: str = ""

    @property
    def verdict(self) -> Verdict | None:
        return self.verdicts[0] if self.verdicts else None


@dataclass(slots=True)
class _Facts:
    """What the rules share, read once from the evidence."""

    evidence: Evidence
    state: JobState  # how its latest run ended (or RUNNING while it runs)
    reason: str  # that end's reason
    run_events: list[JobEvent]
    lines: list[str]
    progress: Progress | None
    verdicts: list[Verdict] = field(default_factory=list)


def diagnose(evidence: Evidence, signatures: Sequence[Signature] = ()) -> tuple[Verdict, ...]:
    """The verdicts, heaviest first (one per name); () for a job that never ran."""
    job = evidence.job
    if job.start_count == 0 and job.state is not JobState.FAILED:
        return ()
    facts = _facts(evidence)
    _from_the_end(facts)
    _from_output(facts, signatures)
    _from_gpus(facts)
    if facts.state is JobState.RUNNING:
        for flag in evidence.flags:
            facts.verdicts.append(_flag_verdict(flag))
    if not facts.verdicts and facts.state is JobState.COMPLETED:
        facts.verdicts.append(Verdict("completed", "it completed (exit code 0)", weight=0))
    ranked: dict[str, Verdict] = {}
    for verdict in sorted(facts.verdicts, key=lambda v: -v.weight):
        ranked.setdefault(verdict.name, verdict)
    return tuple(ranked.values())


def _facts(evidence: Evidence) -> _Facts:
    job = evidence.job
    run = _latest_run(evidence.events)
    state, reason = job.state, (job.result.reason if job.result else "") or job.reason
    if job.state in (JobState.PENDING, JobState.HELD):  # again, after a run: how it ended
        ended = [e for e in run if e.from_state is JobState.RUNNING]
        if ended:
            state, reason = ended[-1].to_state, ended[-1].reason
    tails = list(dict.fromkeys(e.output_tail for e in evidence.ends if e.output_tail))
    lines = tail_lines("\n".join(tails)) if tails else []
    progress = latest_progress("\n".join(lines)) if lines else None
    return _Facts(evidence, state, reason, run, lines, progress)


def _latest_run(events: Sequence[JobEvent]) -> list[JobEvent]:
    """The events from the latest start on (all of them for a job that never started)."""
    starts = [i for i, e in enumerate(events) if e.to_state is JobState.RUNNING]
    return list(events[starts[-1] :]) if starts else list(events)


# ---- how it ended ---------------------------------------------------------------------------


def _from_the_end(facts: _Facts) -> None:
    state, reason = facts.state, facts.reason
    xids = [x for e in facts.run_events for x in xids_in(e.reason)]
    xids += [x for x in xids_in(reason) if x not in xids]
    for xid in dict.fromkeys(xids):
        facts.verdicts.append(_xid_verdict(xid, facts))
    if state is JobState.OUT_OF_MEMORY:
        facts.verdicts.append(_oom_verdict(facts))
    elif state is JobState.TIMEOUT:
        facts.verdicts.append(_time_verdict(facts))
    elif state is JobState.PREEMPTED:
        facts.verdicts.append(_preempted_verdict(facts))
    elif state is JobState.NODE_FAIL and not any(is_hardware_xid(x) for x in xids):
        facts.verdicts.append(_node_verdict(facts))
    elif state is JobState.CANCELLED:
        facts.verdicts.append(_cancelled_verdict(facts))
    elif state is JobState.FAILED:
        _failed(facts)


def _failed(facts: _Facts) -> None:
    job, reason = facts.evidence.job, facts.reason
    result = job.result
    if (first := _RANK_FIRST.search(reason)) is not None:
        facts.verdicts.append(_rank_verdict(first, facts))
    elif "launch failed" in reason:
        facts.verdicts.append(
            Verdict(
                "launch-failure",
                "it never started: the launch failed",
                (reason,),
                "check the script and its #! line, and that the working folder and output "
                "folder exist on the node and are yours; then submit again",
                80,
            )
        )
    signal = result.signal if result is not None else None
    code = result.exit_code if result is not None else None
    if signal is None and code is not None and 128 < code < 160:
        signal = code - 128  # a shell reports its child's death by a signal so
    if signal is not None:
        facts.verdicts.append(_signal_verdict(signal, code, reason))
    elif code is not None and code > 0 and first is None:
        facts.verdicts.append(
            Verdict(
                "exit-code",
                f"it exited with code {code}",
                (reason,) if reason else (),
                "its own error: the last lines of its output (`gpuq logs JOB`) say why",
                10,
            )
        )


def _xid_verdict(xid: int, facts: _Facts) -> Verdict:
    said = [e.reason for e in facts.run_events if f"XID {xid}" in e.reason]
    if not said and f"XID {xid}" in facts.reason:
        said = [facts.reason]
    if is_hardware_xid(xid):
        return Verdict(
            "gpu-xid",
            f"a GPU hardware fault on its GPU: {xid_text(xid)}",
            tuple(dict.fromkeys(said)),
            xid_advice(xid),
            95,
        )
    return Verdict(
        "gpu-app-xid",
        f"its program faulted on the GPU: {xid_text(xid)}",
        tuple(dict.fromkeys(said)),
        xid_advice(xid),
        55,
    )


def _oom_verdict(facts: _Facts) -> Verdict:
    job, reason = facts.evidence.job, facts.reason
    if "GPU share" in reason:
        return Verdict(
            "gpu-share-oom",
            "it used more GPU memory than its share (MPS) allows",
            (reason,),
            "ask for a larger --gpu-mem with its --gpu-share, or a whole GPU",
            100,
        )
    limit = job.spec.resources.mem
    peaks = [(e.peak_mem, e.node) for e in facts.evidence.ends if e.peak_mem]
    lines = [reason] if reason else []
    if peaks:
        peak, node = max(peaks)
        asked = f" of --mem {format_size(limit)}" if limit else ""
        lines.append(f"peak host memory {format_size(peak)}{asked} on {node}")
    lines += _oom_kill_lines(facts)
    base = max([limit or 0, *(p for p, _ in peaks)])
    more = f"--mem {_round_up_size(base * 1.5)}" if base else "a larger --mem"
    title = "its host memory limit" + (f" (--mem {format_size(limit)})" if limit else "")
    return Verdict(
        "host-oom",
        f"killed by {title}: the kernel's OOM killer",
        tuple(lines),
        f"ask for more host memory ({more}), or use less: fewer or lighter DataLoader "
        "workers, a memory-mapped dataset instead of one loaded whole",
        100,
    )


def _oom_kill_lines(facts: _Facts) -> list[str]:
    """The kernel's own word in the output, when a shell printed it ("Killed")."""
    killed = [line for line in facts.lines if re.search(r"(?:^|: line \d+: +\d+ )Killed\b", line)]
    return [f"output: {quote(killed[-1])}"] if killed else []


def _round_up_size(size: float) -> str:
    """A size to ask for: whole GiB (MiB under 1 GiB), rounded up."""
    if size >= GIB:
        return f"{math.ceil(size / GIB)}G"
    return f"{math.ceil(size / (1 << 20))}M"


def _time_verdict(facts: _Facts) -> Verdict:
    job, progress = facts.evidence.job, facts.progress
    limit = facts.evidence.time_limit
    limit_text = format_duration(limit) if limit else "its time limit"
    elapsed = (job.end_time or 0) - (job.start_time or 0) if job.start_time else None
    lines = [facts.reason] if facts.reason else []
    rate = progress.rate if progress is not None else None
    if (
        progress is not None
        and rate is None
        and elapsed
        and progress.done > 0
        and not progress.label
    ):
        rate = progress.done / elapsed  # its own average over the run
    if progress is None or not rate:
        advice = (
            "ask for a longer --time, or checkpoint and resume; print progress (a tqdm bar, or "
            "GPUQ_PROGRESS step/total lines) and gpuq can say how long it needs"
        )
        if _idle(job):
            advice += "; its GPUs were idle: it may have hung"
        return Verdict(
            "time-limit", f"it reached its time limit ({limit_text})", tuple(lines), advice, 80
        )
    unit = progress.unit or "it"
    speed = rate_text(rate, unit)
    done = _count(progress.done)
    lines.append(f"output: {_progress_text(progress, unit)}, at {speed}")
    title = f"it reached its time limit ({limit_text}) while still making progress ({speed})"
    if progress.total and not progress.label and progress.total > progress.done:
        left = progress.total - progress.done
        more = left / rate
        need = (elapsed or limit or 0) + more
        advice = (
            f"at {speed} the remaining {_count(left)} {unit} take about {_span(more)} more: "
            f"submit again with --time {format_duration(_round_up_time(need * TIME_MARGIN))}, "
            "or checkpoint and resume"
        )
    else:
        advice = (
            f"at {speed} it did {done} {unit} in {_span(elapsed or limit or 0)}: ask for a "
            "longer --time for the work left, or checkpoint and resume"
        )
    return Verdict("time-limit", title, tuple(lines), advice, 80)


def _progress_text(progress: Progress, unit: str) -> str:
    total = f"/{_count(progress.total)}" if progress.total else ""
    label = f" ({progress.label})" if progress.label else ""
    return f"{_count(progress.done)}{total} {unit}{label}"


def rate_text(rate: float, unit: str) -> str:
    """`3.2 it/s`, or `4.5 s/it` under one a second (as tqdm prints it)."""
    if rate >= 1:
        return f"{_figure(rate)} {unit}/s"
    return f"{_figure(1 / rate)} s/{unit}"


def _figure(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0") if value < 100 else f"{value:.0f}"


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


def _span(seconds: float) -> str:
    """A duration as people say it: 45 s, 12 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _round_up_time(seconds: float) -> int:
    """Whole minutes (whole hours past 10 h), rounded up."""
    step = 3600 if seconds > 36000 else 60
    return int(math.ceil(seconds / step) * step)


def _preempted_verdict(facts: _Facts) -> Verdict:
    requeued = facts.evidence.job.state.is_live
    return Verdict(
        "preempted",
        "a job of higher priority took its GPUs (preempted)",
        (facts.reason,) if facts.reason else (),
        ("gpuq requeued it; " if requeued else "")
        + "what it did is lost unless it checkpoints: save on SIGTERM (or --signal SIG@S) and "
        "resume from the checkpoint, or use a QOS that is not preempted",
        70,
    )


def _node_verdict(facts: _Facts) -> Verdict:
    requeued = facts.evidence.job.state.is_live
    return Verdict(
        "node-failure",
        "its node failed: " + (facts.reason or "node_fail"),
        (facts.reason,) if facts.reason else (),
        "not the job's fault: "
        + (
            "gpuq requeued it"
            if requeued
            else "submit it again (its QOS or --no-requeue kept it from being requeued)"
        ),
        75,
    )


def _cancelled_verdict(facts: _Facts) -> Verdict:
    ended = [e for e in facts.run_events if e.to_state is JobState.CANCELLED]
    by = ended[-1].cause if ended and ended[-1].cause else ""
    lines = tuple(x for x in (facts.reason, f"cause: {by}" if by else "") if x)
    return Verdict(
        "cancelled",
        "it was cancelled" + (f" ({by})" if by else ""),
        lines,
        "nothing to fix: it was stopped on request",
        50,
    )


def _rank_verdict(first: re.Match[str], facts: _Facts) -> Verdict:
    rank, node, what = first["rank"], first["node"], first["what"]
    ended = [e for e in facts.run_events if e.to_state is JobState.FAILED]
    lines = [facts.reason]
    if ended and ended[-1].cause:
        lines.append(f"cause: {ended[-1].cause}")
    stopped = f"; {first['stopped']}" if first["stopped"] else ""
    return Verdict(
        "rank-failed-first",
        f"task {rank} on {node} failed first ({what}){stopped}",
        tuple(lines),
        f"find task {rank}'s own cause first: its lines in the output (srun --label marks "
        "each line with its task) and the other verdicts here; if it shows none, rerun with "
        "NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) and check the nodes' topology and "
        "network (nvidia-smi topo -m, NCCL_SOCKET_IFNAME, NCCL_IB_HCA)",
        85,
    )


def _signal_verdict(signal: int, code: int | None, reason: str) -> Verdict:
    name, weight, text, advice = _SIGNALS.get(
        signal,
        (
            "signal",
            35,
            f"signal {signal}",
            "look at the last lines of its output and at who sent it",
        ),
    )
    how = f"killed by {text}"
    if code is not None and code > 128 and signal == code - 128:
        how = f"exit code {code}: a process it ran was killed by {text}"
        weight -= 5
    return Verdict(name, how, (reason,) if reason else (), advice, weight)


# ---- its output -----------------------------------------------------------------------------


def _from_output(facts: _Facts, signatures: Sequence[Signature]) -> None:
    if not facts.lines:
        return
    for finding in find_signatures(facts.lines, signatures):
        facts.verdicts.append(_signature_verdict(finding, facts.evidence.job))
    traceback = last_traceback(facts.lines)
    if traceback is not None:
        where = f"{traceback.file}:{traceback.line}"
        lines = [f"raised at {where}, in {traceback.function}"]
        if traceback.code:
            lines.append(f"code: {traceback.code}")
        facts.verdicts.append(
            Verdict(
                "python-traceback",
                f"a Python exception: {_short(traceback.exception)}",
                tuple(lines),
                f"the exception was raised at {where} ({traceback.function}): start there",
                30,
            )
        )


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _signature_verdict(finding: Finding, job: Job) -> Verdict:
    signature = finding.signature
    lines = [f"output: {quote(finding.line)}"]
    if finding.count > 1:
        lines.append(f"and {finding.count - 1} more such lines")
    advice = signature.advice
    if signature.name == "cuda-oom":
        figures, advice = _cuda_oom_advice(finding.line, job, advice)
        lines += figures
    return Verdict(signature.name, signature.meaning, tuple(lines), advice, signature.weight)


def _cuda_oom_advice(line: str, job: Job, default: str) -> tuple[list[str], str]:
    """PyTorch's figures, and expandable segments when much reserved memory was free but
    fragmented; else a bigger GPU, slice or share."""
    oom = torch_oom(line)
    figures = []
    if oom.tried is not None:
        figures.append(f"it tried to allocate {format_size(oom.tried)}")
    reserved = oom.reserved
    if reserved and oom.unallocated is not None and oom.allocated is not None:
        share = oom.unallocated / reserved
        figures.append(
            f"PyTorch held {format_size(reserved)}: {format_size(oom.allocated)} allocated, "
            f"{format_size(oom.unallocated)} ({share:.0%}) reserved but unallocated"
        )
        large = oom.unallocated >= GIB or share >= LARGE_UNALLOCATED
        if oom.tried is not None and oom.unallocated >= oom.tried:
            large = True
        if large and oom.unallocated >= 64 << 20:
            return figures, (
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the job's environment: "
                f"{format_size(oom.unallocated)} of what PyTorch reserved was free but "
                "fragmented, which expandable segments let it use"
            )
    if oom.capacity is not None:
        figures.append(f"the GPU has {format_size(oom.capacity)}")
    if oom.tried is None and reserved is None:
        return figures, default
    return figures, _bigger_gpu(job)


def _bigger_gpu(job: Job) -> str:
    res = job.spec.resources
    smaller = "or make the step smaller (batch size, activation checkpointing, mixed precision)"
    if res.mig:
        bigger = f"than its MIG {res.mig} slice: a bigger --mig profile"
    elif res.gpu_share:
        bigger = "than its share: a larger --gpu-mem with --gpu-share"
    else:
        bigger = "than its GPU has: a bigger GPU (--gpu-mem, --gpu-type)"
    return f"it needs more GPU memory {bigger}, {smaller}"


# ---- its GPUs -------------------------------------------------------------------------------


def _idle(job: Job) -> bool:
    t = job.telemetry
    return (
        t is not None
        and bool(job.gpus)
        and t.seconds >= MIN_MEASURED
        and t.samples >= 2
        and t.util_p95 is not None
        and t.util_p95 < IDLE_P95
    )


def _from_gpus(facts: _Facts) -> None:
    job = facts.evidence.job
    t = job.telemetry
    if t is None or not job.gpus or t.seconds < MIN_MEASURED or t.util_mean is None:
        return
    p95 = t.util_p95 or 0.0
    measured = f"GPU utilisation mean {t.util_mean:.0f} %, p95 {p95:.0f} % over {_span(t.seconds)}"
    if _idle(job):
        facts.verdicts.append(
            Verdict(
                "gpu-idle",
                "its GPUs sat idle for the whole run",
                (measured,),
                "check that it uses the GPU (torch.cuda.is_available(), tensors moved to "
                "'cuda'; gpuq sets CUDA_VISIBLE_DEVICES); if it needs none, submit without "
                "--gpus",
                45,
            )
        )
    elif t.util_mean < INPUT_BOUND_MEAN and facts.progress is not None and facts.progress.rate:
        speed = rate_text(facts.progress.rate, facts.progress.unit or "it")
        facts.verdicts.append(
            Verdict(
                "input-bound",
                f"low GPU use while making steady progress ({speed}): likely bound by data "
                "loading or the CPU",
                (measured,),
                "more DataLoader workers (num_workers, with --cpus to match), pin_memory=True, "
                "prefetching, data on local scratch; profile one step to be sure",
                35,
            )
        )


def _flag_verdict(flag: str) -> Verdict:
    if "hung" in flag:
        return Verdict(
            "possibly-hung",
            "it may have hung",
            (flag,),
            "if it waits in a collective, one rank may have died: look at each rank's output, "
            "then rerun with NCCL_DEBUG=INFO",
            60,
        )
    if "idle" in flag:
        return Verdict(
            "gpu-idle-now",
            "its GPUs are idle",
            (flag,),
            "check that it uses the GPU; if it is done with them, end it (gpuq cancel)",
            45,
        )
    return Verdict("flag", flag, (flag,), "", 30)
