"""XID events through the fake NVML library's event set, and the event thread's safety."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.gpu.backend import GpuEvent


def make(tmp_path: Path, spec: str) -> FakeGpuBackend:
    return FakeGpuBackend(spec, "node-a", state_dir=tmp_path, health_every=1, reinit_interval=0)


def xid(tmp_path: Path, uuid: str, *codes: int) -> None:
    (tmp_path / uuid).mkdir(exist_ok=True)
    with (tmp_path / uuid / "xid").open("a") as found:
        found.write("".join(f"{code}\n" for code in codes))


def test_a_hardware_xid_makes_its_unit_unhealthy_until_reset(tmp_path: Path) -> None:
    backend = make(tmp_path, "2")
    first, second = (u.uuid for u in backend.inventory().units)
    xid(tmp_path, first, 79)
    events = backend.wait_events(5)
    assert events == [GpuEvent(first, 79, True, "XID 79 (GPU has fallen off the bus)")]
    usage = {u.uuid: u for u in backend.usage()}
    assert usage[first].health == "unhealthy" and "XID 79" in usage[first].reason
    assert usage[second].health == "ok"
    assert backend.wait_events(0.05) == [], "each line is delivered once"
    assert backend.refresh() is False
    assert backend.usage()[0].health == "unhealthy", "sticky across a refresh"
    (tmp_path / first / "lost").touch()  # the GPU goes away ...
    backend.refresh()
    (tmp_path / first / "lost").unlink()  # ... and comes back: it was reset
    backend.refresh()
    assert {u.health for u in backend.usage()} == {"ok"}


def test_an_application_xid_does_not_drain(tmp_path: Path) -> None:
    backend = make(tmp_path, "1")
    (unit,) = (u.uuid for u in backend.inventory().units)
    xid(tmp_path, unit, 13, 43)
    events = backend.wait_events(5)
    events += backend.wait_events(0.2) if len(events) < 2 else []
    assert [(e.xid, e.hardware) for e in events] == [(13, False), (43, False)]
    assert "graphics engine exception" in events[0].text
    assert backend.usage()[0].health == "ok"


def test_a_whole_gpu_event_on_a_mig_gpu_reaches_every_slice(tmp_path: Path) -> None:
    backend = make(tmp_path, "1xA100-80GB:mig=3g.40gb+3g.40gb,1")
    first, second, _other = (u.uuid for u in backend.inventory().units)
    parent = backend.inventory().units[0].parent_uuid
    assert parent is not None
    xid(tmp_path, parent, 48)
    assert {(e.uuid, e.xid, e.hardware) for e in backend.wait_events(5)} == {
        (first, 48, True),
        (second, 48, True),
    }
    xid(tmp_path, second, 31)  # narrowed by the GPU instance id in the event data
    assert [(e.uuid, e.xid) for e in backend.wait_events(5)] == [(second, 31)]
    assert [u.health for u in backend.usage()] == ["unhealthy", "unhealthy", "ok"]


def test_timeouts_and_the_unversioned_wait(tmp_path: Path) -> None:
    backend = make(tmp_path, "1")
    started = time.monotonic()
    assert backend.wait_events(0.3) == []
    assert 0.25 <= time.monotonic() - started < 2
    (tmp_path / "errors").write_text("nvmlEventSetWait_v2 FunctionNotFound\n")
    (unit,) = (u.uuid for u in backend.inventory().units)
    xid(tmp_path, unit, 94)
    assert [e.xid for e in backend.wait_events(5)] == [94]


@pytest.mark.parametrize("error", ["Unknown", "GpuIsLost", "NotSupported"])
def test_event_errors_never_raise(tmp_path: Path, error: str) -> None:
    backend = make(tmp_path, "1")
    (tmp_path / "errors").write_text(
        f"nvmlEventSetWait_v2 {error}\nnvmlEventSetWait {error}\nnvmlEventSetCreate {error}\n"
    )
    started = time.monotonic()
    assert backend.wait_events(0.2) == []
    assert time.monotonic() - started >= 0.15, "no busy loop"


def test_events_on_one_thread_while_usage_and_refresh_run_on_another(tmp_path: Path) -> None:
    backend = make(tmp_path, "4")
    units = [u.uuid for u in backend.inventory().units]
    got: list[GpuEvent] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            got.extend(backend.wait_events(0.1))

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        for round_ in range(20):
            backend.usage()
            if round_ % 5 == 0:
                backend.refresh()
            if round_ == 3:
                xid(tmp_path, units[2], 92)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            backend.usage()
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    assert [(e.uuid, e.xid) for e in got] == [(units[2], 92)]
    backend.close()
    assert backend.wait_events(0.01) == []


def test_a_refresh_that_changes_no_handles_keeps_the_event_set(tmp_path: Path) -> None:
    backend = make(tmp_path, "1xA100-80GB:mig=3g.40gb+3g.40gb")
    generation = backend.generation
    assert backend.refresh() is False
    assert backend.generation == generation, "no XID is lost to a needless rebuild"
    parent = backend.inventory().units[0].parent_uuid
    assert parent is not None
    (tmp_path / parent).mkdir()
    (tmp_path / parent / "mig").write_text("7g.80gb")
    assert backend.refresh() is True
    (unit,) = backend.inventory().units
    xid(tmp_path, parent, 79)
    assert [(e.uuid, e.xid) for e in backend.wait_events(5)] == [(unit.uuid, 79)]
