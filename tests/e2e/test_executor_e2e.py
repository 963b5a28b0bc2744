"""gpuq.Executor against a real coordinator and agents with fake GPUs: callables run as jobs,
their results and exceptions come back through the run folder."""

from __future__ import annotations

import concurrent.futures
import os
import stat
import threading
import time

import pytest
from e2e_cluster import Cluster, wait_for

import gpuq
from gpuq.domain.states import JobState
from gpuq.executor import JobFailed, RemoteError


def executor_for(cluster: Cluster, **options: object) -> gpuq.Executor:
    return gpuq.Executor(
        folder=cluster.root / "executor",
        client=cluster.client(),
        chdir=str(cluster.root),
        time="2",
        **options,
    )


def visible_devices() -> str:
    """By reference: the job imports this module (the submitter's sys.path goes along)."""
    return os.environ["CUDA_VISIBLE_DEVICES"]


def test_a_closure_returns_its_value_and_sees_its_gpu(cluster: Cluster) -> None:
    offset = 40
    with executor_for(cluster) as executor:
        future = executor.submit(lambda x: x + offset, 2, mem="1G")
        assert future.result(timeout=60) == 42
        assert future.done() and not future.cancelled()
        with_gpu = executor.submit(visible_devices, gpus=1)
        devices = with_gpu.result(timeout=60)
    job = cluster.job(int(with_gpu.job))
    assert job.state is JobState.COMPLETED and len(job.gpus) == 1
    assert devices == job.gpus[0] and devices.startswith("GPU-")
    run_folder = executor.folder
    assert stat.S_IMODE(run_folder.stat().st_mode) == 0o700
    # the payloads and results are gone once read; the output files stay
    assert sorted(p.name for p in run_folder.iterdir()) == ["0.out", "1.out"]


def test_a_remote_exception_comes_back_with_its_traceback(cluster: Cluster) -> None:
    def check(value: int) -> int:
        if value < 0:
            raise ValueError(f"negative value {value}")
        return value

    with executor_for(cluster) as executor:
        future = executor.submit(check, -7)
        error = future.exception(timeout=60)
    assert isinstance(error, ValueError) and str(error) == "negative value -7"
    notes = "\n".join(getattr(error, "__notes__", []))
    assert f"remote traceback of gpuq job {future.job}" in notes
    # the frames of the job, down to the function's (cloudpickle sent it by value: no source)
    assert "gpuq/executor_worker.py" in notes and "in check" in notes
    assert notes.endswith("ValueError: negative value -7")
    with pytest.raises(ValueError, match="negative value -7"):
        future.result()
    job = cluster.job(int(future.job))
    assert job.state is JobState.FAILED  # the worker exits 1: history shows it failed
    assert job.result is not None and job.result.exit_code == 1


def test_an_exception_that_does_not_pickle_comes_back_as_remote_error(cluster: Cluster) -> None:
    class Unpicklable(Exception):
        def __init__(self) -> None:
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    def fail() -> None:
        raise Unpicklable()

    with executor_for(cluster) as executor:
        error = executor.submit(fail).exception(timeout=60)
    assert isinstance(error, RemoteError)
    assert "Unpicklable: holds a lock" in str(error)
    assert "in fail" in "\n".join(error.__notes__)


def test_jobs_submitted_while_others_run_come_back(cluster: Cluster) -> None:
    """The watcher's stream is reopened for jobs submitted after it opened."""
    with executor_for(cluster) as executor:
        slow = executor.submit(time.sleep, 60)
        wait_for(slow.running, 30, "the slow job to run")
        quick = [executor.submit(abs, -i) for i in range(4)]
        done = concurrent.futures.as_completed(quick, timeout=30)
        assert sorted(f.result() for f in done) == [0, 1, 2, 3]
        assert not slow.done()
        cluster.client().cancel(slow.job)


def test_map_is_one_array_job_and_yields_in_order(cluster: Cluster) -> None:
    client = cluster.client()
    with executor_for(cluster) as executor:
        squares = list(executor.map(lambda x, y: x * x + y, range(5), [10] * 5, timeout=90))
    assert squares == [10, 11, 14, 19, 26]
    jobs = client.list(finished=True)
    assert {j.array_job_id for j in jobs} == {jobs[0].array_job_id} and jobs[0].array_job_id
    tasks = client.list_raw(array_job_id=jobs[0].array_job_id)
    assert sorted(t.array_task_id for t in tasks if not t.array_tasks) == [0, 1, 2, 3, 4]
    assert {t.state for t in tasks} == {"completed"}


def test_map_in_chunks_is_one_task_per_chunk(cluster: Cluster) -> None:
    with executor_for(cluster) as executor:
        assert list(executor.map(str, range(7), chunksize=3)) == [str(i) for i in range(7)]
    client = cluster.client()
    array = client.list(finished=True)[0].array_job_id
    tasks = client.list_raw(array_job_id=array)
    assert sorted(t.array_task_id for t in tasks if not t.array_tasks) == [0, 1, 2]


def test_cancelling_a_pending_future_cancels_its_job(cluster: Cluster) -> None:
    with executor_for(cluster) as executor:
        future = executor.submit(print, "never", hold=True)
        cluster.wait_state(int(future.job), "held")
        assert future.cancel() and future.cancelled()
        job = cluster.wait_state(int(future.job), "cancelled")
        assert "gpuq.Executor" in job.reason
        done, _ = concurrent.futures.wait([future], timeout=5)
        assert done == {future}
        running = executor.submit(time.sleep, 30)
        wait_for(running.running, 30, "the future to run")
        assert not running.cancel()  # the base class's rule: a running call is not cancelled
        cluster.client().cancel(running.job)
        with pytest.raises(JobFailed, match=f"gpuq job {running.job} ended cancelled"):
            running.result(timeout=30)


def test_a_job_killed_by_its_time_limit_raises_naming_timeout(cluster: Cluster) -> None:
    with executor_for(cluster) as executor:
        future = executor.submit(time.sleep, 60, time=2)  # seconds
        with pytest.raises(JobFailed) as caught:
            future.result(timeout=60)
    error = caught.value
    assert error.state == "timeout" and error.job == future.job
    assert f"gpuq job {future.job} ended timeout" in str(error)
    assert error.output == str(executor.folder / "0.out") and error.output in str(error)


def test_shutdown_cancels_the_futures_not_started(cluster: Cluster) -> None:
    executor = executor_for(cluster)
    held = [executor.submit(print, i, hold=True) for i in range(3)]
    mapped = executor.map(print, range(2), hold=True)
    started = time.monotonic()
    executor.shutdown(wait=True, cancel_futures=True)
    assert time.monotonic() - started < 20
    assert all(f.cancelled() for f in held)
    for future in held:
        assert cluster.job(int(future.job)).state is JobState.CANCELLED
    with pytest.raises(concurrent.futures.CancelledError):
        next(mapped)
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(print, 1)
