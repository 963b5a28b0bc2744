"""Each queued job's fit key is made once, when it is queued, and handed to every pass with the
job (a pass that explains 100,000 jobs spent a fifth of its time making them again). The key
must follow the job through every change: an edit while it waits, a start, a requeue, a reload
of memory; a stale key would make a pass place or explain the job as it was."""

from __future__ import annotations

import dataclasses

from helpers import make_spec

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.domain.model import Job, Resources
from gpuq.domain.states import JobState


def memory() -> tuple[SchedulerInputs, LiveJobs]:
    inputs = SchedulerInputs(CoordinatorSettings())
    return inputs, LiveJobs(inputs.key, lambda job: inputs.priority(job, 0.0))


def passes_key(inputs: SchedulerInputs, jobs: LiveJobs, job: Job) -> object:
    return inputs.pending(jobs.jobs[job.id], jobs).fit


def test_a_queued_job_reaches_the_pass_with_the_key_of_its_current_spec() -> None:
    inputs, jobs = memory()
    job = Job(1, make_spec("a", gpus=1), "alice", JobState.PENDING, "normal", 0, 0.0)
    jobs.put(job)
    assert passes_key(inputs, jobs, job) == inputs.key(job)
    assert jobs.shapes == {inputs.key(job): 1}

    # `gpuq update` while it waits: two GPUs now, and the pass sees two
    edited = dataclasses.replace(job, spec=make_spec("a", resources=Resources(gpus=2, cpus=3)))
    jobs.put(edited)
    assert passes_key(inputs, jobs, edited) == inputs.key(edited) != inputs.key(job)
    assert jobs.shapes == {inputs.key(edited): 1}

    # started: out of the queue, no key kept; requeued: queued with its key again
    jobs.put(dataclasses.replace(edited, state=JobState.RUNNING))
    assert jobs.keys == {} and not jobs.shapes
    requeued = dataclasses.replace(edited, state=JobState.PENDING)
    jobs.put(requeued)
    assert passes_key(inputs, jobs, requeued) == inputs.key(edited)

    # held, then ended: nothing left behind
    jobs.put(dataclasses.replace(requeued, state=JobState.HELD))
    assert passes_key(inputs, jobs, requeued) is None  # not queued: a pass makes it
    jobs.put(dataclasses.replace(requeued, state=JobState.CANCELLED))
    assert jobs.keys == {} and not jobs.shapes


def test_a_reload_of_memory_keeps_keys_only_of_the_jobs_reloaded() -> None:
    inputs, jobs = memory()
    first = Job(1, make_spec("a", gpus=1), "alice", JobState.PENDING, "normal", 0, 0.0)
    second = Job(2, make_spec("b", gpus=4), "bob", JobState.PENDING, "normal", 0, 0.0)
    jobs.put(first)
    jobs.put(second)
    jobs.reset([second])
    assert jobs.keys == {2: inputs.key(second)}
    assert jobs.shapes == {inputs.key(second): 1}


def test_a_version_of_a_job_memory_no_longer_holds_gets_no_key_of_another() -> None:
    """A snapshot taken in slices (the background explanation) may hold a job as it was
    before an edit: it must not get the edited version's key."""
    inputs, jobs = memory()
    old = Job(1, make_spec("a", gpus=1), "alice", JobState.PENDING, "normal", 0, 0.0)
    jobs.put(old)
    jobs.put(dataclasses.replace(old, spec=make_spec("a", gpus=8)))
    assert inputs.pending(old, jobs).fit is None
