"""The pure rules of the cluster's history and ranked queue (issue 26): a map's columns are
bounded whatever its range and always cover it; a cell is its main holder's; the queue's
filters (partition, a part of the name in any case) and what a name filter may match where
names are private."""

from __future__ import annotations

import pytest
from helpers import make_spec

from gpuq.coordinator.front.ranked_queue import QueueFilter, queue_filter
from gpuq.domain.gpu_history import BUCKET, MAX_COLUMNS, Unit, UnitUse, frame, history_map
from gpuq.domain.model import Job
from gpuq.domain.node_constraints import Placement
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.identity import Caller


@pytest.mark.parametrize("span", [60, 3600, 6 * 3600, 86400, 7 * 86400, 14 * 86400, 400 * 86400])
def test_a_map_covers_its_range_in_at_most_max_columns(span: float) -> None:
    now = 1_700_000_123.4
    cols = frame(span, now)
    assert cols.columns <= MAX_COLUMNS
    assert cols.width % BUCKET == 0 and cols.start % cols.width == 0
    assert cols.start <= now - span and cols.start + cols.columns * cols.width > now
    assert cols.column(int(now) // BUCKET * BUCKET) == cols.columns - 1


def test_units_come_in_node_and_index_order_and_unknown_ones_after() -> None:
    cols = frame(3600, 10_000.0)
    use = UnitUse("b", "GPU-gone", cols.start, 1, "alice")
    use.add(None, 5)
    units = [Unit("b", "GPU-b1", 1), Unit("a", "GPU-a0", 0), Unit("b", "GPU-b0", 0)]
    mapped = history_map(cols, units, [use])
    assert [r.unit.uuid for r in mapped.rows] == ["GPU-a0", "GPU-b0", "GPU-b1", "GPU-gone"]
    [cell] = mapped.rows[-1].cells
    assert cell.util is None and cell.peak_mem == 5  # held, utilisation unknown


def job(name: str, user: str = "alice", partitions: tuple[str, ...] = ()) -> Job:
    spec = make_spec(name, placement=Placement(partitions=partitions))
    return Job(1, spec, user, JobState.PENDING, "normal", 0, 0.0)


def test_queue_filters_and_private_names() -> None:
    assert queue_filter("", "", "gpu", "").matches(job("x", partitions=("gpu", "cpu")))
    assert not queue_filter("", "", "gpu", "").matches(job("x", partitions=("cpu",)))
    assert queue_filter("", "", "", "Sweep").matches(job("my-SWEEP-3"))
    with pytest.raises(InvalidInput):
        queue_filter("", "done", "", "")
    # names hidden from other users: bob's name filter matches only his own jobs
    bob = Caller("bob", None)
    mine = queue_filter("", "", "", "sweep").for_caller(bob, ("names",))
    assert mine == QueueFilter(user="bob", name="sweep")
    assert not queue_filter("alice", "", "", "s").for_caller(bob, ("names",)).matches(job("s"))
    admin = Caller("root", 0, admin=True)
    assert queue_filter("", "", "", "s").for_caller(admin, ("names",)).user is None
