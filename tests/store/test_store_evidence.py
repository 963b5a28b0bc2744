"""The store's job evidence (issue 26): what each node sent with a job's end, one row per job
and node (a later start's replaces it), only for jobs the store has, with the output's tail
bounded and its NULs dropped. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from helpers import make_spec

from gpuq.domain.diagnosis import EndEvidence
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.evidence_rows import MAX_OUTPUT_TAIL
from gpuq.store.records import JobStart, NewJob, StateChange


def add(store: Store, nodes: tuple[str, ...] = ("n0", "n1")) -> int:
    """A job started on `nodes` (its first start)."""
    new = NewJob(make_spec("t", gpus=1), user="alice", qos="normal", priority=0)
    with store.transaction() as tx:
        [[job_id]] = tx.add_jobs([new], 100.0)
    parts = tuple((node, (f"GPU-{node}",)) for node in nodes)
    with store.transaction() as tx:
        gpus = tuple(u for _, units in parts for u in units)
        tx.start_jobs([JobStart(job_id, nodes[0], gpus, parts=parts)], now=110.0)
    return job_id


def start_again(store: Store, job_id: int) -> None:
    with store.transaction() as tx:
        tx.transition([StateChange(job_id, JobState.NODE_FAIL, "node lost")], now=120.0)
        tx.transition([StateChange(job_id, JobState.PENDING, "requeued")], now=120.0)
    parts = (("n0", ("GPU-n0",)), ("n1", ("GPU-n1",)))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, "n0", ("GPU-n0", "GPU-n1"), parts=parts)], now=130.0)


def test_each_nodes_evidence_is_kept_and_a_later_start_replaces_it(store: Store) -> None:
    job_id = add(store)
    first = EndEvidence("n0", 1, 5 << 30, "Traceback (most recent call last):\n")
    other = EndEvidence("n1", 1, 1 << 30, "rank 1 output\n")
    with store.transaction() as tx:
        assert tx.keep_evidence([(job_id, first), (job_id, other)], now=10.0) == 2
    assert store.end_evidence(job_id) == [first, other]
    again = EndEvidence("n0", 2, 7 << 30, "CUDA out of memory\n")
    start_again(store, job_id)
    with store.transaction() as tx:
        tx.keep_evidence([(job_id, again)], now=20.0)
    assert store.end_evidence(job_id) == [again, other]


def test_only_a_node_of_the_jobs_latest_start_leaves_evidence(store: Store) -> None:
    job_id = add(store)
    kept = EndEvidence("n0", 1, 0, "Killed\n")
    stranger = EndEvidence("n9", 1, 0, "not mine\n")
    stale = EndEvidence("n1", 7, 0, "another start\n")
    with store.transaction() as tx:
        items = [(job_id + 1000, kept), (job_id, stranger), (job_id, stale), (job_id, kept)]
        assert tx.keep_evidence(items, now=10.0) == 1
    assert store.end_evidence(job_id) == [kept]
    assert store.end_evidence(job_id + 1000) == []


def test_a_tail_is_bounded_and_holds_no_nul(store: Store) -> None:
    job_id = add(store)
    tail = "x" * (MAX_OUTPUT_TAIL + 10) + "bin\x00ary\n"
    with store.transaction() as tx:
        tx.keep_evidence([(job_id, EndEvidence("n0", 1, 2**63 - 1, tail))], now=10.0)
    [stored] = store.end_evidence(job_id)
    assert stored.output_tail.endswith("binary\n") and "\x00" not in stored.output_tail
    assert len(stored.output_tail) <= MAX_OUTPUT_TAIL
    assert stored.peak_mem == 2**62
