"""Preemption as the coordinator decides it, in process on a real store (SQLite and
PostgreSQL), with agents that run nothing (tests/harness.py): a higher QOS stops a preemptible
job (its agent is told why, and with which warning signal), which goes back to the queue and
runs again as its next start, or, submitted with --no-requeue, ends preempted. (What the job's
processes do with the signal, checkpointing and resuming, stays in tests/e2e/test_policy_e2e.py.)"""

from __future__ import annotations

import signal

from harness import FakeAgent, InProcessClient, run, until

from gpuq.coordinator.server import Coordinator
from gpuq.domain.states import JobState
from gpuq.store.api import Store


def test_a_preempted_job_goes_back_to_the_queue_and_runs_again(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        a = await FakeAgent(co, "a", "4xA100-80GB").connect()
        await FakeAgent(co, "b", "2xL4-24GB").connect()
        alice = InProcessClient(co, "alice")
        low = await alice.submit("train.sh", gpus=4, qos="low")
        first = await a.started(low)
        high = await alice.submit("echo high ran on $GPUQ_NODE", gpus=4, qos="high")
        await until(lambda: a.stops)
        [stop] = a.stops  # SIGTERM (the job checkpoints), then SIGKILL after the grace
        assert (stop.job_id, stop.end_state, stop.attempt) == (low, "preempted", first.attempt)
        assert stop.reason.startswith(f"preempted by job {high}")
        assert stop.signal in (0, signal.SIGTERM)
        # its agent reports it gone: the high job takes its GPUs, then it runs again
        await a.started(high)
        a.end(high)
        assert (await alice.wait_state(high, "completed")).node == "a"
        again = await a.started(low)
        assert again.attempt == first.attempt + 1
        assert again.requeue_count == 1  # its output is appended to; GPUQ_RESTART_COUNT=1
        a.end(low)
        job = await alice.wait_state(low, "completed", "failed")
        assert job.state is JobState.COMPLETED
        assert job.requeue_count == 1
        _, events = await alice.detail(low)
        assert [e.to_state.value for e in events] == [
            "pending",
            "running",
            "preempted",
            "pending",
            "running",
            "completed",
        ]
        assert events[2].reason.startswith(f"preempted by job {high}")
        high_job = await alice.get(high)
        assert high_job.start_time is not None and high_job.start_time >= events[2].at

    run(store, body)


def test_a_no_requeue_job_ends_preempted_after_its_warning_signal(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        a = await FakeAgent(co, "a", "4xA100-80GB").connect()
        b = await FakeAgent(co, "b", "2xL4-24GB").connect()
        alice = InProcessClient(co, "alice")
        low = await alice.submit(gpus=2, qos="low", no_requeue=True, signal="USR1")
        first = await b.started(low)
        # fill node a so that the high job can only get node b by preemption
        filler = await alice.submit(gpus=4)
        await a.started(filler)
        high = await alice.submit(gpus=2, qos="high")
        await until(lambda: b.stops)
        [stop] = b.stops
        assert (stop.job_id, stop.end_state, stop.attempt) == (low, "preempted", first.attempt)
        assert stop.signal == signal.SIGUSR1  # the warning its supervisor sends first
        job = await alice.wait_state(low, "preempted")
        assert job.requeue_count == 0
        await b.started(high)
        b.end(high)
        assert (await alice.wait_state(high, "completed")).node == "b"
        a.end(filler)
        await alice.wait_state(filler, "completed")
        assert (await alice.get(low)).state is JobState.PREEMPTED  # it stays ended
        assert [launch.job_id for launch in b.launches] == [low, high]

    run(store, body)
