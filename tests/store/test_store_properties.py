"""Random sequences of operations against the state machine and the store, on both backends.

Properties: no illegal transition is accepted (and a refused one changes nothing), every accepted
change has its event row, and no GPU unit ever has two live allocations, which is checked in
the database itself, not through the store's API.
"""

from __future__ import annotations

import itertools
from collections import Counter

from helpers import make_spec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete, func, select

from gpuq.domain.states import TRANSITIONS, JobState
from gpuq.errors import DoubleBooking, IllegalTransition
from gpuq.store.api import Store
from gpuq.store.records import JobQuery, JobStart, NewJob, StateChange
from gpuq.store.tables import allocations, job_events, jobs

UNITS = [f"GPU-{i}" for i in range(5)]
TARGETS = [s for s in JobState if s is not JobState.RUNNING]


class StoreMachine(RuleBasedStateMachine):
    store: Store

    def __init__(self) -> None:
        super().__init__()
        with self.store.engine.begin() as conn:
            for table in (job_events, allocations, jobs):
                conn.execute(delete(table))
        self.states: dict[int, JobState] = {}
        self.event_counts: Counter[int] = Counter()
        self.live: dict[str, int] = {}  # unit -> job
        self.now = 0.0

    job_ids = Bundle("job_ids")

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    @rule(target=job_ids, hold=st.booleans())
    def submit(self, hold: bool) -> int:
        with self.store.transaction() as tx:
            [[job_id]] = tx.add_jobs([NewJob(make_spec(hold=hold), "u", "normal", 0)], self._tick())
        self.states[job_id] = JobState.HELD if hold else JobState.PENDING
        self.event_counts[job_id] += 1
        return job_id

    @rule(job_id=job_ids, to_state=st.sampled_from(TARGETS))
    def change_state(self, job_id: int, to_state: JobState) -> None:
        current = self.states[job_id]
        legal = to_state in TRANSITIONS[current]
        try:
            with self.store.transaction() as tx:
                tx.transition([StateChange(job_id, to_state, "test")], self._tick())
        except IllegalTransition:
            assert not legal, f"{current} -> {to_state} refused but the table allows it"
            return
        assert legal, f"{current} -> {to_state} accepted but the table forbids it"
        self.states[job_id] = to_state
        self.event_counts[job_id] += 1
        if current is JobState.RUNNING:
            self.live = {u: j for u, j in self.live.items() if j != job_id}

    @rule(
        job_id=job_ids,
        units=st.lists(st.sampled_from(UNITS), min_size=0, max_size=3, unique=True),
    )
    def start(self, job_id: int, units: list[str]) -> None:
        pending = self.states[job_id] is JobState.PENDING
        free = not any(u in self.live for u in units)
        try:
            with self.store.transaction() as tx:
                tx.start_jobs([JobStart(job_id, "n1", tuple(units))], self._tick())
        except IllegalTransition:
            assert not pending
            return
        except DoubleBooking:
            assert pending and not free
            return
        assert pending and free, "a start was accepted that must have been refused"
        self.states[job_id] = JobState.RUNNING
        self.event_counts[job_id] += 1
        self.live.update({u: job_id for u in units})

    @rule(first=job_ids, second=job_ids, unit=st.sampled_from(UNITS))
    def start_two_on_one_unit(self, first: int, second: int, unit: str) -> None:
        """A buggy plan giving one unit to two jobs is refused whole."""
        before = dict(self.states)
        try:
            with self.store.transaction() as tx:
                tx.start_jobs(
                    [JobStart(first, "n1", (unit,)), JobStart(second, "n1", (unit,))],
                    self._tick(),
                )
        except (IllegalTransition, DoubleBooking):
            return
        raise AssertionError(f"two jobs got {unit}; states were {before}")

    @invariant()
    def states_match(self) -> None:
        if not self.states:
            return
        stored = {j.id: j.state for j in self.store.list_jobs(JobQuery())}
        assert stored == self.states

    @invariant()
    def every_change_has_its_event(self) -> None:
        for job_id, count in self.event_counts.items():
            events = self.store.events(job_id)
            assert len(events) == count
            for before, after in itertools.pairwise(events):
                assert after.from_state == before.to_state
            assert events[-1].to_state == self.states[job_id]

    @invariant()
    def no_unit_has_two_live_allocations(self) -> None:
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                select(allocations.c.unit, func.count())
                .where(allocations.c.live)
                .group_by(allocations.c.unit)
            ).all()
        assert all(count == 1 for _, count in rows), rows
        assert {unit for unit, _ in rows} == set(self.live)


def test_store_state_machine(store: Store) -> None:
    machine = type("Machine", (StoreMachine,), {"store": store})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
