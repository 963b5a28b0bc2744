"""What a user's live jobs hold (the per-user bytes cap, `max_queued_bytes_per_user`) follows
their jobs through every change of state, counted once, and is freed when they end."""

from __future__ import annotations

import dataclasses

from helpers import make_spec

from gpuq.coordinator.memory.live_jobs import LiveJobs, spec_size
from gpuq.domain.model import Job
from gpuq.domain.states import JobState


def test_a_users_bytes_are_counted_once_while_live_and_freed_at_the_end() -> None:
    jobs = LiveJobs(key_of=lambda job: job.spec.resources, priority_of=lambda job: 0.0)  # type: ignore[arg-type, return-value]
    spec = dataclasses.replace(make_spec("x"), env={"HOME": "/home/alice", "BIG": "y" * 1000})
    first = Job(1, spec, "alice", JobState.PENDING, "normal", 0, 0.0)
    second = Job(2, spec, "alice", JobState.HELD, "normal", 0, 0.0)
    size = spec_size(spec)
    jobs.put(first)
    jobs.put(second)
    assert jobs.user_bytes["alice"] == 2 * size
    for state in (JobState.RUNNING, JobState.PENDING, JobState.RUNNING):  # a requeue
        first = dataclasses.replace(first, state=state)
        jobs.put(first)
        assert jobs.user_bytes["alice"] == 2 * size
    # an edit that gives the job another spec counts the new one instead
    edited = dataclasses.replace(spec, env={"HOME": "/home/alice"})
    second = dataclasses.replace(second, spec=edited)
    jobs.put(second)
    assert jobs.user_bytes["alice"] == size + spec_size(edited)
    jobs.put(dataclasses.replace(first, state=JobState.COMPLETED))
    jobs.put(dataclasses.replace(second, state=JobState.CANCELLED))
    assert "alice" not in jobs.user_bytes
