"""The agent's reactions to GPU events, with the fake NVML and a stand-in hub: an XID storm
is one note and one log line, a hardware XID stops the job holding the unit."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.fake.gpu_spec import GIB
from gpuq.agent.fake.gpu_state import claim_fake_vram, set_fake_utilization
from gpuq.agent.gpu.backend import GpuEvent
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.config.settings import AgentSettings


class Hub:
    def __init__(self, running: dict[int, tuple[str, ...]]) -> None:
        self.running = running

    def running_jobs(self) -> list[int]:
        return sorted(self.running)

    def launch_spec_of(self, job_id: int) -> None:
        return None

    def supervisor_pids(self) -> dict[int, int]:
        return {}


def care(tmp_path: Path, stops: list[tuple[int, str, str]]) -> tuple[NodeGpus, list[str]]:
    backend = FakeGpuBackend("2xH100-80GB", "n1", state_dir=tmp_path / "fake-gpus")
    units = [u.uuid for u in backend.inventory().units]

    async def stop(job_id: int, state: str, reason: str, grace: float) -> None:
        stops.append((job_id, state, reason))

    gpu_care = NodeGpus(
        backend,
        AgentSettings(node_name="n1"),
        Hub({7: (units[0],)}),  # type: ignore[arg-type]
        beat_now=lambda: None,
        units_changed=lambda: None,
        stop_job=stop,
    )
    gpu_care.holders.job_units[7] = (units[0],)
    return gpu_care, units


def test_an_application_xid_storm_is_one_note_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stops: list[tuple[int, str, str]] = []
    gpu_care, units = care(tmp_path, stops)
    event = GpuEvent(units[0], 13, False, "XID 13 (graphics engine exception)")
    with caplog.at_level(logging.WARNING, logger="gpuq.agent.gpu.xid_events"):
        for _ in range(1000):
            asyncio.run(gpu_care.xids.on_event(event))
    assert len(caplog.records) == 1
    assert stops == []
    assert gpu_care.xids.end_notes(7) == "XID 13 (graphics engine exception) on GPU 0"


def test_a_hardware_xid_stops_the_job_on_that_unit_only(tmp_path: Path) -> None:
    stops: list[tuple[int, str, str]] = []
    gpu_care, units = care(tmp_path, stops)
    asyncio.run(gpu_care.xids.on_event(GpuEvent(units[1], 79, True, "XID 79 (fell off the bus)")))
    assert stops == []  # nobody holds GPU 1
    asyncio.run(gpu_care.xids.on_event(GpuEvent(units[0], 48, True, "XID 48 (double-bit ECC)")))
    assert stops == [(7, "node_fail", "GPU 0 failed: XID 48 (double-bit ECC)")]


class SpecHub(Hub):
    """A hub whose job 7 runs as `pid` and writes to `out` (its launch spec's output file)."""

    def __init__(self, running: dict[int, tuple[str, ...]], pid: int, out: Path) -> None:
        super().__init__(running)
        self.pid = pid
        self.out = out

    def launch_spec_of(self, job_id: int) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(cwd="/", stdout_path=str(self.out), stderr_path=str(self.out))

    def supervisor_pids(self) -> dict[int, int]:
        return {self.pid: 7}


def test_each_read_feeds_the_jobs_telemetry(tmp_path: Path) -> None:
    state = tmp_path / "fake-gpus"
    backend = FakeGpuBackend("2xH100-80GB", "n1", state_dir=state)
    units = [u.uuid for u in backend.inventory().units]
    out = tmp_path / "job.out"
    out.write_bytes(b"x" * 100)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        hub = SpecHub({7: (units[0],)}, sleeper.pid, out)
        gpu_care = NodeGpus(
            backend,
            AgentSettings(node_name="n1"),
            hub,  # type: ignore[arg-type]
            beat_now=lambda: None,
            units_changed=lambda: None,
            stop_job=lambda *_: asyncio.sleep(0),
        )
        gpu_care.holders.job_units[7] = (units[0],)
        claim_fake_vram(units[0], 20 * GIB, pid=sleeper.pid, state_dir=state)
        claim_fake_vram(units[1], 3 * GIB, pid=sleeper.pid, state_dir=state)  # not its unit
        set_fake_utilization(units[0], 80, state_dir=state)
        gpu_care.reads.usage()
        first = gpu_care.reads.last_read
        gpu_care.reads.usage(max_age=60)  # a read that recent does: NVML is not read again
        assert gpu_care.reads.last_read == first
        claim_fake_vram(units[0], 5 * GIB, pid=sleeper.pid, state_dir=state)
        set_fake_utilization(units[0], 20, state_dir=state)
        gpu_care.reads.usage()
        (sample,) = gpu_care.telemetry.job_samples()
        assert (sample.job_id, sample.gpu_mem, sample.output_bytes) == (7, 5 * GIB, 100)
        assert [(u.uuid, u.util, u.memory) for u in sample.units] == [(units[0], 20.0, 5 * GIB)]
        assert sample.so_far.peak_gpu_mem == 20 * GIB
        assert sample.so_far.samples == 2
        out.unlink()
        out.symlink_to("/etc/passwd")  # the job's symlink is not followed
        gpu_care.reads.usage()
        assert gpu_care.telemetry.job_samples()[0].output_bytes == 0
        telemetry = gpu_care.telemetry.end_telemetry(7)
        assert telemetry is not None
        assert (telemetry.peak_gpu_mem, telemetry.samples) == (20 * GIB, 3)
        assert telemetry.util_mean == pytest.approx(40.0)
        assert telemetry.HasField("energy")
        gpu_care.reads.usage()  # it ended: no more samples, no heartbeat entry
        assert gpu_care.telemetry.job_samples() == []
        assert gpu_care.telemetry.end_telemetry(7) == telemetry  # kept for a report sent again
        assert gpu_care.telemetry.ended_telemetry(7) == telemetry
        gpu_care.telemetry.forget(7)  # acknowledged: a later start is measured anew
        assert gpu_care.telemetry.ended_telemetry(7) is None
        gpu_care.reads.usage()
        assert gpu_care.telemetry.job_samples()[0].so_far.samples == 1
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_jobs_end_reads_its_units_anew_and_keeps_the_others_figures(tmp_path: Path) -> None:
    """The heartbeat that goes with an end must see whether the job's processes left its
    units; the other units' figures may come from a recent read (a drain of short jobs would
    otherwise read every unit per end)."""
    state = tmp_path / "fake-gpus"
    backend = FakeGpuBackend("2xH100-80GB", "n1", state_dir=state)
    units = [u.uuid for u in backend.inventory().units]
    out = tmp_path / "job.out"
    out.write_bytes(b"")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        hub = SpecHub({7: (units[0],), 8: (units[1],)}, sleeper.pid, out)
        gpu_care = NodeGpus(
            backend,
            AgentSettings(node_name="n1"),
            hub,  # type: ignore[arg-type]
            beat_now=lambda: None,
            units_changed=lambda: None,
            stop_job=lambda *_: asyncio.sleep(0),
        )
        gpu_care.holders.job_units[7] = (units[0],)
        gpu_care.holders.job_units[8] = (units[1],)  # held: its utilisation is read
        set_fake_utilization(units[1], 10, state_dir=state)
        gpu_care.reads.usage()
        first = gpu_care.reads.last_read
        # job 7 ends, but its process still holds its unit; meanwhile GPU 1 got busier
        claim_fake_vram(units[0], 2 * GIB, pid=sleeper.pid, state_dir=state)
        set_fake_utilization(units[1], 90, state_dir=state)
        del hub.running[7]
        held = gpu_care.job_ended(7)
        assert held == (units[0],)
        figures = {u.uuid: u for u in gpu_care.reads.usage(max_age=60, fresh=held)}
        assert figures[units[0]].health == "dirty"
        assert "job 7" in figures[units[0]].health_reason
        assert figures[units[1]].utilization == 10  # from the last read of every unit
        assert gpu_care.reads.last_read == first
        gpu_care.reads.usage()  # every unit read: the figures are current again
        figures = {u.uuid: u for u in gpu_care.reads.usage(max_age=60)}
        assert (figures[units[0]].health, figures[units[1]].utilization) == ("dirty", 90)
    finally:
        sleeper.kill()
        sleeper.wait()
