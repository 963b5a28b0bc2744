"""The agent's reactions to GPU events, with the fake NVML and a stand-in hub: an XID storm
is one note and one log line, a hardware XID stops the job holding the unit."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gpuq.agent.gpu_care import GpuCare
from gpuq.agent.gpus import GpuEvent
from gpuq.agent.gpus_fake import FakeGpuBackend
from gpuq.config import AgentSettings


class Hub:
    def __init__(self, running: dict[int, tuple[str, ...]]) -> None:
        self.running = running

    def running_jobs(self) -> list[int]:
        return sorted(self.running)

    def launch_spec_of(self, job_id: int) -> None:
        return None

    def supervisor_pids(self) -> dict[int, int]:
        return {}


def care(tmp_path: Path, stops: list[tuple[int, str, str]]) -> tuple[GpuCare, list[str]]:
    backend = FakeGpuBackend("2xH100-80GB", "n1", state_dir=tmp_path / "fake-gpus")
    units = [u.uuid for u in backend.inventory().units]

    async def stop(job_id: int, state: str, reason: str, grace: float) -> None:
        stops.append((job_id, state, reason))

    gpu_care = GpuCare(
        backend,
        AgentSettings(node_name="n1"),
        Hub({7: (units[0],)}),  # type: ignore[arg-type]
        beat_now=lambda: None,
        units_changed=lambda: None,
        stop_job=stop,
    )
    gpu_care.job_units[7] = (units[0],)
    return gpu_care, units


def test_an_application_xid_storm_is_one_note_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stops: list[tuple[int, str, str]] = []
    gpu_care, units = care(tmp_path, stops)
    event = GpuEvent(units[0], 13, False, "XID 13 (graphics engine exception)")
    with caplog.at_level(logging.WARNING, logger="gpuq.agent.gpu_care"):
        for _ in range(1000):
            asyncio.run(gpu_care._on_event(event))
    assert len(caplog.records) == 1
    assert stops == []
    assert gpu_care.end_notes(7) == "XID 13 (graphics engine exception) on GPU 0"


def test_a_hardware_xid_stops_the_job_on_that_unit_only(tmp_path: Path) -> None:
    stops: list[tuple[int, str, str]] = []
    gpu_care, units = care(tmp_path, stops)
    asyncio.run(gpu_care._on_event(GpuEvent(units[1], 79, True, "XID 79 (fell off the bus)")))
    assert stops == []  # nobody holds GPU 1
    asyncio.run(gpu_care._on_event(GpuEvent(units[0], 48, True, "XID 48 (double-bit ECC)")))
    assert stops == [(7, "node_fail", "GPU 0 failed: XID 48 (double-bit ECC)")]
