"""gpuq update's rules (owners may only lower what admins limit), bulk selections and
requeue's refusals: pure functions, no server."""

from __future__ import annotations

import pytest
from helpers import make_spec

from gpuq.coordinator.workload.selection import Filters, select_live
from gpuq.coordinator.workload.update_rules import (
    Update,
    check_requeue,
    dependency_cycle,
    plan_update,
)
from gpuq.domain.dependencies import Dependency
from gpuq.domain.model import Job, Resources
from gpuq.domain.policy import QosTier
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput, PermissionDenied, Unsatisfiable

TIERS = {
    "normal": QosTier("normal", priority=1000, default_time=3600, max_time=7200),
    "low": QosTier("low", priority=10, default_time=600, max_time=3600),
}


def job(
    state: JobState = JobState.PENDING,
    time_limit: int | None = 1800,
    user: str = "alice",
    job_id: int = 5,
    **spec: object,
) -> Job:
    resources = Resources(gpus=1, time_limit=time_limit)
    return Job(
        id=job_id,
        spec=make_spec(f"job{job_id}", resources=resources, **spec),
        user=user,
        state=state,
        qos="normal",
        priority=1000,
        submit_time=1.0,
    )


def test_an_owner_may_lower_a_time_limit_but_not_raise_it() -> None:
    edit = plan_update(job(), Update(time_limit=600), "alice", False, TIERS)
    assert edit.spec.resources.time_limit == 600
    assert edit.changes == ("time 00:30:00 -> 00:10:00",)
    with pytest.raises(PermissionDenied, match="only admins may raise a time limit"):
        plan_update(job(), Update(time_limit=3600), "alice", False, TIERS)
    # without a limit of its own the QOS default is what it has
    with pytest.raises(PermissionDenied):
        plan_update(job(time_limit=None), Update(time_limit=3601), "alice", False, TIERS)
    assert plan_update(job(), Update(time_limit=7200), "root", True, TIERS).changes


def test_the_qos_maximum_binds_admins_too() -> None:
    with pytest.raises(InvalidInput, match="qos normal allows at most"):
        plan_update(job(), Update(time_limit=7201), "root", True, TIERS)
    with pytest.raises(InvalidInput, match="qos low allows at most"):
        plan_update(job(time_limit=7000), Update(qos="low"), "root", True, TIERS)


def test_nice_goes_up_for_owners_and_down_for_admins() -> None:
    assert plan_update(job(), Update(nice=5), "alice", False, TIERS).priority == 995
    with pytest.raises(PermissionDenied, match="only admins may lower nice"):
        plan_update(job(nice=5), Update(nice=2), "alice", False, TIERS)
    with pytest.raises(PermissionDenied):
        plan_update(job(), Update(nice=-1), "alice", False, TIERS)
    assert plan_update(job(), Update(nice=-1), "root", True, TIERS).priority == 1001


def test_qos_change_sets_priority_and_unknown_qos_is_refused() -> None:
    edit = plan_update(job(), Update(qos="low"), "alice", False, TIERS)
    assert (edit.qos, edit.priority, edit.spec.qos) == ("low", 10, "low")
    with pytest.raises(InvalidInput, match="no such qos"):
        plan_update(job(), Update(qos="gold"), "alice", False, TIERS)


def test_the_new_spec_is_validated_as_a_whole() -> None:
    with pytest.raises(InvalidInput, match="--gpu-mem"):
        plan_update(job(), Update(gpus=0, gpu_mem=2**30), "alice", False, TIERS)
    with pytest.raises(InvalidInput, match="--name"):
        plan_update(job(), Update(name="bad\tname"), "alice", False, TIERS)
    with pytest.raises(InvalidInput, match="itself"):
        plan_update(
            job(), Update(set_dependencies=True, dependencies=(Dependency(5),)), "a", True, TIERS
        )


def test_only_waiting_jobs_are_updated_and_hold_moves_them() -> None:
    with pytest.raises(Unsatisfiable, match="job 5 is running: only pending or held jobs"):
        plan_update(job(JobState.RUNNING), Update(nice=1), "alice", False, TIERS)
    assert plan_update(job(), Update(hold=True), "alice", False, TIERS).to_state is JobState.HELD
    held = job(JobState.HELD)
    assert plan_update(held, Update(hold=False), "alice", False, TIERS).to_state is JobState.PENDING
    assert plan_update(held, Update(hold=True), "alice", False, TIERS).to_state is None


def test_bulk_filters_match_all_given_and_a_users_own_jobs() -> None:
    jobs = [
        job(job_id=1, user="alice"),
        job(JobState.HELD, job_id=2, user="alice"),
        job(job_id=3, user="bob"),
    ]
    held = Filters(states=frozenset({JobState.HELD}))
    assert [j.id for j in select_live(jobs, held, "alice", False)] == [2]
    assert [j.id for j in select_live(jobs, Filters(name="job*"), "alice", False)] == [1, 2]
    assert [j.id for j in select_live(jobs, Filters(name="job*"), "root", True)] == [1, 2, 3]
    assert [j.id for j in select_live(jobs, Filters(user="bob"), "root", True)] == [3]
    assert not Filters()


def test_a_dependency_cycle_is_found() -> None:
    waits_on = {2: [3], 3: [5]}
    assert dependency_cycle(5, (Dependency(2),), waits_on) == 5
    assert dependency_cycle(5, (Dependency(3),), {3: [4]}) is None


def test_requeue_refuses_no_requeue_and_waiting_jobs() -> None:
    check_requeue(job(JobState.FAILED))
    check_requeue(job(JobState.RUNNING))
    with pytest.raises(Unsatisfiable, match="--no-requeue"):
        check_requeue(job(JobState.FAILED, requeue=False))
    with pytest.raises(Unsatisfiable, match="queued already"):
        check_requeue(job(JobState.PENDING))
