"""The store's contract, run against SQLite and PostgreSQL (the `store` fixture is per backend)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_spec

from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.model import GpuUnit, JobResult, Node, NodeState
from gpuq.domain.states import JobState
from gpuq.errors import DoubleBooking, IllegalTransition, NotFound
from gpuq.store.api import Store
from gpuq.store.records import JobEdit, JobQuery, JobStart, NewJob, StateChange


def submit(store: Store, *specs_and_priorities: tuple[str, int], now: float = 100.0) -> list[int]:
    new = [
        NewJob(make_spec(name, gpus=1), user="alice", qos="normal", priority=prio)
        for name, prio in specs_and_priorities
    ]
    with store.transaction() as tx:
        ids = tx.add_jobs(new, now)
    return [i for group in ids for i in group]


def test_submitted_job_reads_back_whole(store: Store) -> None:
    spec = make_spec("train", gpus=2, env={"A": "1"}, args=("x", "y"), nice=5)
    with store.transaction() as tx:
        [[job_id]] = tx.add_jobs([NewJob(spec, "alice", "normal", 7)], now=123.5)
    job = store.get_job(job_id)
    assert job.spec == spec
    assert (job.user, job.state, job.priority, job.submit_time) == (
        "alice",
        JobState.PENDING,
        7,
        123.5,
    )
    events = store.events(job_id)
    assert [(e.from_state, e.to_state, e.reason) for e in events] == [
        (None, JobState.PENDING, "submitted")
    ]


def test_a_job_started_in_the_transaction_that_adds_it_is_stored_as_one_started_later(
    store: Store,
) -> None:
    """A submission to an idle queue starts its job in the transaction that adds it (the store
    keeps the row it inserted instead of reading it back): the row and its events are those of
    a job added in one transaction and started in the next."""
    rows = []
    for unit in ("GPU-a", "GPU-b"):
        with store.transaction() as tx:
            [[job_id]] = tx.add_jobs([NewJob(make_spec(gpus=1), "alice", "normal", 3)], 10.0)
            if unit == "GPU-a":
                tx.start_jobs([JobStart(job_id, "n1", (unit,))], 10.0)
        if unit == "GPU-b":
            with store.transaction() as tx:
                tx.start_jobs([JobStart(job_id, "n1", (unit,))], 10.0)
        job = dataclasses.replace(store.get_job(job_id), id=0, gpus=())
        events = [(e.from_state, e.to_state, e.reason, e.at) for e in store.events(job_id)]
        rows.append((job, events))
    assert rows[0] == rows[1]
    assert rows[0][0].state is JobState.RUNNING and rows[0][0].start_count == 1


def test_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_job(424242)


def test_hold_submits_held(store: Store) -> None:
    with store.transaction() as tx:
        [[job_id]] = tx.add_jobs([NewJob(make_spec(hold=True), "bob", "normal", 0)], 1.0)
    assert store.get_job(job_id).state is JobState.HELD


def test_array_is_one_record_until_tasks_are_split(store: Store) -> None:
    spec = make_spec("sweep", array=ArraySpec((0, 2, 4, 6), max_running=2))
    with store.transaction() as tx:
        [ids] = tx.add_jobs([NewJob(spec, "alice", "normal", 0)], 1.0)
    [array] = ids
    [record] = store.list_jobs(JobQuery(array_job_id=array))
    assert (record.id, record.array_task_id, record.tasks) == (array, None, (0, 2, 4, 6))
    assert record.display_id == f"{array}_[0-6:2%2]"
    with store.transaction() as tx:
        state, split = tx.split_tasks(array, [0, 2], 2.0)
    assert state is JobState.PENDING
    jobs = store.list_jobs(JobQuery(array_job_id=array))
    assert [(j.array_task_id, j.tasks) for j in jobs] == [(None, (4, 6)), (0, ()), (2, ())]
    assert all(j.spec == spec and j.submit_time == 1.0 for j in jobs)  # the spec, stored once
    assert store.find_task(array, 2) == store.get_job(split[2])
    assert store.find_task(array, 6) == store.get_job(array)  # still in the record
    assert store.find_task(array, 5) is None
    with store.transaction() as tx:
        _, last = tx.split_tasks(array, [4, 6], 3.0)
    assert last[6] == array  # the record became the last task
    assert store.get_job(array).array_task_id == 6 and store.get_job(array).tasks == ()
    counts = store.array_states([array])[array]
    assert counts == {JobState.PENDING: 4}
    with pytest.raises(NotFound), store.transaction() as tx:
        tx.split_tasks(array, [4], 4.0)


def test_top_pending_orders_by_priority_then_submit_order(store: Store) -> None:
    ids = submit(store, ("a", 1), ("b", 5), ("c", 5), ("d", 3))
    with store.transaction() as tx:
        tx.transition([StateChange(ids[2], JobState.HELD, "held by alice")], 2.0)
    assert [j.id for j in store.top_pending(3)] == [ids[1], ids[3], ids[0]]


def test_start_and_end_records_events_and_releases_gpus(store: Store) -> None:
    [job_id] = submit(store, ("a", 0))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, "n1", ("GPU-1",))], now=200.0)
    job = store.get_job(job_id)
    assert (job.state, job.node, job.gpus, job.start_time) == (
        JobState.RUNNING,
        "n1",
        ("GPU-1",),
        200.0,
    )
    assert [a.gpus for a in store.live_allocations()] == [("GPU-1",)]
    with store.transaction() as tx:
        tx.transition(
            [
                StateChange(
                    job_id, JobState.FAILED, "exit code 3", JobResult(3, None, "exit code 3")
                )
            ],
            now=260.0,
        )
    job = store.get_job(job_id)
    assert job.state is JobState.FAILED
    assert job.result == JobResult(3, None, "exit code 3")
    assert job.end_time == 260.0
    assert job.gpus == ("GPU-1",)  # history keeps the last allocation
    assert store.live_allocations() == []
    assert [e.to_state for e in store.events(job_id)] == [
        JobState.PENDING,
        JobState.RUNNING,
        JobState.FAILED,
    ]


def test_gpu_cannot_be_given_twice(store: Store) -> None:
    first, second = submit(store, ("a", 0), ("b", 0))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(first, "n1", ("GPU-1", "GPU-2"))], 1.0)
    with pytest.raises(DoubleBooking, match="GPU-2"), store.transaction() as tx:
        tx.start_jobs([JobStart(second, "n1", ("GPU-2", "GPU-3"))], 2.0)
    assert store.get_job(second).state is JobState.PENDING
    assert [e.to_state for e in store.events(second)] == [JobState.PENDING]


def test_one_plan_cannot_give_a_gpu_to_two_jobs(store: Store) -> None:
    first, second = submit(store, ("a", 0), ("b", 0))
    with pytest.raises(DoubleBooking), store.transaction() as tx:
        tx.start_jobs([JobStart(first, "n1", ("GPU-1",)), JobStart(second, "n1", ("GPU-1",))], 1.0)
    assert store.live_allocations() == []
    assert store.get_job(first).state is JobState.PENDING


def test_released_gpu_can_be_given_again(store: Store) -> None:
    first, second = submit(store, ("a", 0), ("b", 0))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(first, "n1", ("GPU-1",))], 1.0)
    with store.transaction() as tx:
        tx.transition([StateChange(first, JobState.COMPLETED, "exit code 0")], 2.0)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(second, "n1", ("GPU-1",))], 3.0)
    assert [(a.job_id, a.gpus) for a in store.live_allocations()] == [(second, ("GPU-1",))]


def test_illegal_transition_changes_nothing(store: Store) -> None:
    done, other = submit(store, ("a", 0), ("b", 0))
    with store.transaction() as tx:
        tx.transition([StateChange(done, JobState.CANCELLED, "cancelled by alice")], 1.0)
    with pytest.raises(IllegalTransition), store.transaction() as tx:
        tx.transition(
            [
                StateChange(other, JobState.HELD, "held"),  # legal, but in the same batch
                StateChange(done, JobState.PENDING, "resurrect"),
            ],
            2.0,
        )
    assert store.get_job(other).state is JobState.PENDING
    assert store.get_job(done).state is JobState.CANCELLED
    assert len(store.events(other)) == 1


def test_preempted_job_requeues_with_count(store: Store) -> None:
    [job_id] = submit(store, ("a", 0))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, "n1", ("GPU-1",))], 1.0)
    with store.transaction() as tx:
        tx.transition(
            [
                StateChange(job_id, JobState.PREEMPTED, "preempted by job 9"),
                StateChange(job_id, JobState.PENDING, "requeued"),
            ],
            2.0,
        )
    job = store.get_job(job_id)
    assert (job.state, job.requeue_count, job.node) == (JobState.PENDING, 1, None)
    assert store.live_allocations() == []
    assert [e.to_state for e in store.events(job_id)][-2:] == [
        JobState.PREEMPTED,
        JobState.PENDING,
    ]


def test_request_stop_marks_a_running_job_only(store: Store) -> None:
    running, pending = submit(store, ("a", 0), ("b", 0))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(running, "n1", ())], 1.0)
        tx.request_stop(running, JobState.CANCELLED, "cancelled by alice")
    assert store.get_job(running).stop == (JobState.CANCELLED, "cancelled by alice")
    with pytest.raises(NotFound), store.transaction() as tx:
        tx.request_stop(pending, JobState.CANCELLED, "cancelled by alice")
    with pytest.raises(IllegalTransition), store.transaction() as tx:
        tx.request_stop(running, JobState.PENDING, "nonsense")
    with store.transaction() as tx:
        tx.transition([StateChange(running, JobState.CANCELLED, "cancelled by alice")], 2.0)
    assert store.get_job(running).stop is None


def test_a_start_never_received_goes_back_to_pending_and_frees_its_units(store: Store) -> None:
    [job] = submit(store, ("a", 1))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job, "n1", ("GPU-a",))], 1.0)
    assert store.get_job(job).start_count == 1
    with store.transaction() as tx:
        tx.request_stop(job, JobState.CANCELLED, "x")
        reason = "requeued: the agent never received the start"
        tx.transition([StateChange(job, JobState.PENDING, reason)], 2.0)
    back = store.get_job(job)
    assert back.state is JobState.PENDING and back.node is None and back.stop is None
    assert back.requeue_count == 0 and back.start_count == 1
    assert store.live_allocations() == []
    with store.transaction() as tx:  # the unit is free again; the next start is attempt 2
        tx.start_jobs([JobStart(job, "n2", ("GPU-a",))], 3.0)
    assert store.get_job(job).start_count == 2
    assert [e.to_state for e in store.events(job)][-2:] == [JobState.PENDING, JobState.RUNNING]


def test_list_jobs_filters(store: Store) -> None:
    ids = submit(store, ("a", 0), ("b", 0), ("c", 0))
    with store.transaction() as tx:
        tx.add_jobs([NewJob(make_spec("d"), "bob", "normal", 0)], 5.0)
        tx.start_jobs([JobStart(ids[0], "n2", ())], 6.0)
    assert [j.name for j in store.list_jobs(JobQuery(user="bob"))] == ["d"]
    running = store.list_jobs(JobQuery(states=frozenset({JobState.RUNNING})))
    assert [j.id for j in running] == [ids[0]]
    assert [j.id for j in store.list_jobs(JobQuery(node="n2"))] == [ids[0]]
    newest = store.list_jobs(JobQuery(newest_first=True, limit=2))
    assert [j.name for j in newest] == ["d", "c"]
    assert store.count_jobs([JobState.PENDING, JobState.RUNNING]) == {
        JobState.PENDING: 3,
        JobState.RUNNING: 1,
    }


def test_nodes_are_saved_and_updated(store: Store) -> None:
    unit = GpuUnit("GPU-a", 0, "NVIDIA A100", 80 << 30, "00000000:1B:00.0")
    node = Node(
        "n1",
        (unit,),
        cpus=64,
        mem=512 << 30,
        state=NodeState.UP,
        fake=True,
        topology=(("GPU-a", "GPU-b", 5),),
        last_seen=10.0,
    )
    with store.transaction() as tx:
        tx.save_node(node)
    assert store.list_nodes() == [node]
    with store.transaction() as tx:
        tx.set_node_state("n1", NodeState.DOWN, "no heartbeat for 30 s")
    [saved] = store.list_nodes()
    assert (saved.state, saved.reason, saved.last_seen) == (
        NodeState.DOWN,
        "no heartbeat for 30 s",
        10.0,
    )
    with pytest.raises(NotFound), store.transaction() as tx:
        tx.set_node_state("nope", NodeState.DOWN, "")


def test_drains_are_kept_replaced_and_cleared(store: Store) -> None:
    from gpuq.domain.model import Drain

    with store.transaction() as tx:
        tx.set_drain(Drain("a", "", "rack work", "root", 10.0))
        tx.set_drain(Drain("a", "GPU-a-1", "fan", "root", 11.0))
        tx.set_drain(Drain("b", "MIG-b-0", "ECC", "alice", 12.0))
    assert store.drains() == [
        Drain("a", "", "rack work", "root", 10.0),
        Drain("a", "GPU-a-1", "fan", "root", 11.0),
        Drain("b", "MIG-b-0", "ECC", "alice", 12.0),
    ]
    with store.transaction() as tx:  # draining again replaces the reason, who and when
        tx.set_drain(Drain("a", "GPU-a-1", "fan again", "bob", 20.0))
    assert Drain("a", "GPU-a-1", "fan again", "bob", 20.0) in store.drains()
    with store.transaction() as tx:
        assert tx.clear_drain("a", "") is True
        assert tx.clear_drain("a", "") is False  # resuming what is not drained
        assert tx.clear_drain("nowhere", "GPU-x") is False
    assert [(d.node, d.unit) for d in store.drains()] == [("a", "GPU-a-1"), ("b", "MIG-b-0")]


def test_start_reason_and_mig_spec_read_back(store: Store) -> None:
    from dataclasses import replace

    from gpuq.domain.model import Resources

    spec = replace(make_spec("slice"), resources=Resources(mig="3g.71gb", gpu_mem=70 << 30))
    assert spec.resources.gpus == 1  # --mig implies one unit
    with store.transaction() as tx:
        [[job_id]] = tx.add_jobs([NewJob(spec, "alice", "normal", 0)], 1.0)
        why = "started on n1 (GPU isolation advisory: not root)"
        tx.start_jobs([JobStart(job_id, "n1", ("MIG-1",), why)], 2.0)
    job = store.get_job(job_id)
    assert job.spec.resources == spec.resources and job.reason == why
    assert store.events(job_id)[-1].reason == why


def test_a_node_keeps_its_mig_units(store: Store) -> None:
    units = (
        GpuUnit("MIG-1", 0, "A100 MIG 3g.40gb", 40 << 30, "0:1b", "GPU-0", "3g.40gb"),
        GpuUnit("MIG-2", 0, "A100 MIG 3g.40gb", 40 << 30, "0:1b", "GPU-0", "3g.20gb"),
    )
    with store.transaction() as tx:
        tx.save_node(Node("m", units, 8, 1 << 30, NodeState.UP))
    [node] = store.list_nodes()
    assert node.units == units


def test_every_event_keeps_what_caused_it(store: Store) -> None:
    """Each event-writing call keeps its cause with the events it writes (`gpuq show` prints
    it); a call that names none keeps "" (as events from before causes were kept)."""
    new = NewJob(make_spec("c", gpus=1), "alice", "normal", 0, cause="Submit by alice")
    record = NewJob(make_spec("arr", array=ArraySpec((0, 1, 2))), "alice", "normal", 0)
    with store.transaction() as tx:
        [[job_id], [array_id]] = tx.add_jobs([new, record], 100.0)
        tx.edit_jobs(
            [JobEdit(job_id, make_spec("c2", gpus=1), "normal", 0, "renamed")],
            101.0,
            cause="Update by alice",
        )
        tx.start_jobs([JobStart(job_id, "n1", ("GPU-1",))], 102.0, cause="scheduling pass 7")
        tx.add_event(job_id, 103.0, JobState.RUNNING, "idle since 1:00", cause="idle check")
        tx.transition(
            [StateChange(job_id, JobState.COMPLETED, "exit 0")], 104.0, cause="report from node n1"
        )
        tx.requeue_jobs([job_id], "requeued by alice", 105.0, hold=True, cause="Requeue by alice")
        tx.split_tasks(array_id, [0], 106.0, cause="scheduling pass 8")
    assert [(e.to_state.value, e.cause) for e in store.events(job_id)] == [
        ("pending", "Submit by alice"),
        ("pending", "Update by alice"),
        ("running", "scheduling pass 7"),
        ("running", "idle check"),
        ("completed", "report from node n1"),
        ("pending", "Requeue by alice"),
        ("held", "Requeue by alice"),
    ]
    assert [e.cause for e in store.events(array_id)] == [""]  # submitted without a cause
    [task] = [j for j in store.list_jobs(JobQuery(array_job_id=array_id)) if j.id != array_id]
    assert [e.cause for e in store.events(task.id)] == ["scheduling pass 8"]
