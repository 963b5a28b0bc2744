"""A job's diagnosis (gpuq.domain.diagnosis): each verdict family from realistic evidence, the
output samples in diagnosis_logs/ written for these tests (PyTorch, NCCL, CUDA, JAX, tqdm
and shell output as those programs print it), and the ranking that makes one "the" verdict."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers import make_spec

from gpuq.domain.diagnosis import EndEvidence, Evidence, Verdict, diagnose
from gpuq.domain.model import Job, JobEvent, JobResult, JobTelemetry, Resources
from gpuq.domain.states import JobState
from gpuq.signature_files import load_signatures

LOGS = Path(__file__).parent / "diagnosis_logs"
SIGNATURES = load_signatures()
GIB = 1 << 30
START, END = 1000.0, 1300.0


def job(
    state: JobState,
    reason: str = "",
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    resources: Resources | None = None,
    telemetry: JobTelemetry | None = None,
    nodes: tuple[str, ...] = (),
) -> Job:
    live = state.is_live
    return Job(
        id=7,
        spec=make_spec("train", resources=resources or Resources(gpus=1)),
        user="alice",
        state=state,
        qos="normal",
        priority=0,
        submit_time=900.0,
        start_time=START,
        end_time=None if live else END,
        node=nodes[0] if nodes else "a",
        nodes=nodes,
        gpus=("GPU-1",),
        result=None if live else JobResult(exit_code, signal, reason),
        start_count=1,
        reason=reason,
        telemetry=telemetry,
    )


def events(*moves: tuple[JobState, JobState, str, str]) -> tuple[JobEvent, ...]:
    """submitted, started, then each (from, to, reason, cause)."""
    started = (
        JobEvent(7, 900.0, None, JobState.PENDING, "submitted"),
        JobEvent(7, START, JobState.PENDING, JobState.RUNNING, "started on a"),
    )
    return started + tuple(JobEvent(7, END, a, b, r, c) for a, b, r, c in moves)


def tail(name: str) -> tuple[EndEvidence, ...]:
    return (EndEvidence("a", 1, 0, (LOGS / name).read_text()),)


def verdicts(evidence: Evidence) -> tuple[Verdict, ...]:
    return diagnose(evidence, SIGNATURES)


def failed(log: str, code: int = 1, **kwargs: object) -> tuple[Verdict, ...]:
    ended = job(JobState.FAILED, f"exit code {code}", exit_code=code, **kwargs)  # type: ignore[arg-type]
    return verdicts(Evidence(ended, ends=tail(log)))


def test_a_cgroup_oom_kill_names_the_peak_against_the_limit_and_a_bigger_mem() -> None:
    reason = "exceeded --mem 100M: the kernel's OOM killer ended the whole job (memory.oom.group)"
    ended = job(JobState.OUT_OF_MEMORY, reason, exit_code=-9, resources=Resources(mem=100 << 20))
    ends = (EndEvidence("a", 1, 98 << 20, "step 1\n/tmp/job: line 3:  4242 Killed  python x.py\n"),)
    first = verdicts(Evidence(ended, ends=ends))[0]
    assert first.name == "host-oom"
    assert "--mem 100M" in first.title
    assert "peak host memory 98M of --mem 100M on a" in first.evidence
    assert any("Killed" in line for line in first.evidence)
    assert "--mem 150M" in first.advice


def test_a_large_reserved_but_unallocated_share_suggests_expandable_segments() -> None:
    first, *others = failed("torch_oom_fragmented.log")
    assert first.name == "cuda-oom"
    assert "expandable_segments:True" in first.advice
    assert "13.8G" in first.advice
    assert "it tried to allocate 3.9G" in first.evidence
    assert any("13.8G (18%) reserved but unallocated" in line for line in first.evidence)
    # the traceback's last frame is there too, below it
    frame = next(v for v in others if v.name == "python-traceback")
    assert "modeling_llama.py:1196" in frame.evidence[0]
    assert frame.title.startswith("a Python exception: torch.OutOfMemoryError: CUDA out of memory")


def test_a_full_gpu_in_older_pytorch_words_suggests_a_bigger_gpu_not_expandable_segments() -> None:
    first = failed("torch_oom_full.log")[0]
    assert first.name == "cuda-oom"
    assert "expandable_segments" not in first.advice
    assert "bigger GPU" in first.advice
    assert any("174.1M (1%) reserved but unallocated" in line for line in first.evidence)


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        (Resources(mig="1g.10gb"), "bigger --mig profile"),
        (Resources(gpus=1, gpu_share=25, gpu_mem=10 * GIB), "--gpu-share"),
    ],
)
def test_a_full_slice_or_share_suggests_a_bigger_one(resources: Resources, words: str) -> None:
    first = failed("torch_oom_full.log", resources=resources)[0]
    assert first.name == "cuda-oom" and words in first.advice


@pytest.mark.parametrize(
    ("log", "name", "advice"),
    [
        ("nccl_watchdog.log", "nccl-timeout", "NCCL_DEBUG=INFO"),
        ("nccl_error.log", "nccl-error", "NCCL_DEBUG=INFO"),
        ("illegal_access.log", "cuda-illegal-address", "CUDA_LAUNCH_BLOCKING=1"),
        ("device_assert.log", "cuda-device-assert", "index out of range"),
        ("jax_oom.log", "jax-oom", "XLA_PYTHON_CLIENT_MEM_FRACTION"),
        ("cublas.log", "cublas-error", "CUDA_LAUNCH_BLOCKING=1"),
        ("segfault.log", "segfault", "faulthandler"),
    ],
)
def test_each_output_signature_names_its_verdict(log: str, name: str, advice: str) -> None:
    first = failed(log)[0]
    assert (first.name, advice in first.advice) == (name, True)
    assert first.evidence[0].startswith("output: ")


def test_a_traceback_alone_gives_its_last_frame_and_exception() -> None:
    first, last = failed("traceback_plain.log")
    assert first.name == "python-traceback"
    assert first.title == "a Python exception: ValueError: unknown split 'valid'"
    assert first.evidence[0] == "raised at /home/dave/proj/data.py:57, in load_split"
    assert "raise ValueError" in first.evidence[1]
    assert last.name == "exit-code"


def test_a_hardware_xid_on_its_gpu_says_what_the_xid_means() -> None:
    reason = "GPU 0 failed: XID 48 (double-bit ECC error (DBE))"
    ended = job(JobState.NODE_FAIL, reason)
    history = events((JobState.RUNNING, JobState.NODE_FAIL, reason, "report from node a"))
    [first] = verdicts(Evidence(ended, history))
    assert first.name == "gpu-xid"
    assert "XID 48 (double-bit ECC error (DBE))" in first.title
    assert first.evidence == (reason,)
    assert "resubmit" in first.advice and "reset" in first.advice


def test_a_requeued_jobs_diagnosis_is_of_the_run_that_ended() -> None:
    reason = "GPU 1 failed: XID 79 (GPU has fallen off the bus)"
    waiting = replace(job(JobState.PENDING, "requeued"), end_time=None)
    history = events(
        (JobState.RUNNING, JobState.NODE_FAIL, reason, "report from node a"),
        (JobState.NODE_FAIL, JobState.PENDING, "requeued", "report from node a"),
    )
    first = verdicts(Evidence(waiting, history))[0]
    assert first.name == "gpu-xid" and "fallen off the bus" in first.title


def test_an_application_xid_is_the_jobs_own_fault() -> None:
    ended = job(
        JobState.FAILED,
        "exit code 1; XID 31 (GPU memory page fault (MMU fault)) on GPU 0",
        exit_code=1,
    )
    first = verdicts(Evidence(ended))[0]
    assert first.name == "gpu-app-xid" and "compute-sanitizer" in first.advice


def test_a_time_limit_with_tqdm_progress_suggests_a_time_from_the_measured_rate() -> None:
    ended = job(JobState.TIMEOUT, "time limit 00:05:00 reached")
    first = verdicts(Evidence(ended, ends=tail("tqdm_timeout.log"), time_limit=300))[0]
    assert first.name == "time-limit"
    assert "still making progress (3.2 it/s)" in first.title
    # 4072 of 5000 left at 3.2 it/s: 21 min more, after 5 min run: 26.2 min, a fifth more
    assert first.advice.startswith("at 3.2 it/s the remaining 4072 it take about 21 min more")
    assert "--time 00:32:00" in first.advice
    assert "output: 928/5000 it, at 3.2 it/s" in first.evidence


def test_a_time_limit_without_progress_says_how_to_show_it() -> None:
    ended = job(JobState.TIMEOUT, "time limit 00:05:00 reached")
    first = verdicts(Evidence(ended, time_limit=300))[0]
    assert first.name == "time-limit" and "GPUQ_PROGRESS" in first.advice


def test_a_rank_that_failed_first_is_named_with_its_node_and_the_nccl_steps() -> None:
    reason = "task 1 on n1 exited 1 at 09:22:40; task 0 was stopped"
    ended = job(JobState.FAILED, reason, nodes=("n0", "n1"))
    history = events((JobState.RUNNING, JobState.FAILED, reason, "FailJob by alice"))
    ends = (EndEvidence("n0", 1, 0, (LOGS / "nccl_watchdog.log").read_text()),)
    first, *others = verdicts(Evidence(ended, history, ends))
    assert first.name == "rank-failed-first"
    assert first.title == "task 1 on n1 failed first (exited 1); task 0 was stopped"
    assert "cause: FailJob by alice" in first.evidence
    assert "task 1's own cause" in first.advice and "NCCL_DEBUG=INFO" in first.advice
    assert "topology" in first.advice
    assert "nccl-timeout" in [v.name for v in others]  # the symptom ranks below


def test_a_ranks_own_gpu_oom_outranks_the_rank_that_failed_first() -> None:
    reason = "task 3 on n1 exited 1 at 09:22:40; tasks 0-2 were stopped"
    ended = job(JobState.FAILED, reason, nodes=("n0", "n1"))
    names = [v.name for v in verdicts(Evidence(ended, ends=tail("torch_oom_fragmented.log")))]
    assert names[:2] == ["cuda-oom", "rank-failed-first"]


@pytest.mark.parametrize(
    ("state", "reason", "cause", "name", "words"),
    [
        (
            JobState.PREEMPTED,
            "preempted by job 12 (qos high)",
            "scheduling pass 4",
            "preempted",
            "checkpoint",
        ),
        (
            JobState.NODE_FAIL,
            "node a lost: no heartbeat for 300 s",
            "heartbeat check",
            "node-failure",
            "not the job's fault",
        ),
        (JobState.CANCELLED, "cancelled", "Cancel by bob", "cancelled", "Cancel by bob"),
    ],
)
def test_ends_decided_by_gpuq_say_so(
    state: JobState, reason: str, cause: str, name: str, words: str
) -> None:
    history = events((JobState.RUNNING, state, reason, cause))
    first = verdicts(Evidence(job(state, reason), history))[0]
    assert first.name == name
    assert words in first.title + first.advice


def test_a_launch_failure_says_it_never_started() -> None:
    reason = "launch failed: cannot open the output file /nope/out.txt: No such file or directory"
    first = verdicts(Evidence(job(JobState.FAILED, reason)))[0]
    assert first.name == "launch-failure" and first.evidence == (reason,)


@pytest.mark.parametrize(
    ("signal", "code", "name"),
    [(9, -9, "killed"), (11, -11, "segfault"), (None, 137, "killed"), (6, -6, "aborted")],
)
def test_a_signal_names_its_verdict(signal: int | None, code: int, name: str) -> None:
    ended = job(JobState.FAILED, "killed by signal", exit_code=code, signal=signal)
    assert verdicts(Evidence(ended))[0].name == name


def test_gpus_idle_for_the_whole_run() -> None:
    idle = JobTelemetry(peak_gpu_mem=0, util_mean=0.4, util_p95=1.0, samples=60, seconds=300)
    first = verdicts(Evidence(job(JobState.COMPLETED, exit_code=0, telemetry=idle)))[0]
    assert first.name == "gpu-idle" and "mean 0 %" in first.evidence[0]


def test_low_utilisation_with_steady_progress_is_input_bound() -> None:
    low = JobTelemetry(peak_gpu_mem=GIB, util_mean=22.0, util_p95=60.0, samples=60, seconds=300)
    ended = job(JobState.TIMEOUT, "time limit reached", telemetry=low)
    names = [v.name for v in verdicts(Evidence(ended, ends=tail("tqdm_timeout.log")))]
    assert names == ["time-limit", "input-bound"]


def test_a_completed_job_and_one_that_never_ran() -> None:
    assert [v.name for v in verdicts(Evidence(job(JobState.COMPLETED, exit_code=0)))] == [
        "completed"
    ]
    waiting = replace(job(JobState.PENDING), start_count=0, start_time=None)
    assert verdicts(Evidence(waiting)) == ()


def test_a_running_jobs_flags_are_its_diagnosis() -> None:
    flag = "possibly hung (NCCL?): GPUs at 100 % with no progress since 12:03"
    first = verdicts(Evidence(job(JobState.RUNNING), flags=(flag,)))[0]
    assert first.name == "possibly-hung" and first.evidence == (flag,)
