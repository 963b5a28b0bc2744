"""An agent whose launches keep failing stops accepting work for a while (the coordinator then
drains its node: tests/store/test_node_drain_coordinator.py). No processes: the agent's
Supervisors and its fork-server link alone."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_hub_stops_accepting_after_launches_keep_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """LAUNCH_FAILURES_DRAIN refused launches in a row: not accepting (on_health is told),
    for DRAIN_RETRY after the last; a launch that works, or a new fork server, ends it."""
    from gpuq.agent.jobs import fork_server_link
    from gpuq.agent.jobs.supervisors import Supervisors

    told: list[str | None] = []
    hub = Supervisors(Path("/nonexistent"), lambda _: None)
    forks = hub.forks
    forks.on_health = lambda: told.append(forks.not_accepting())
    for _ in range(fork_server_link.LAUNCH_FAILURES_DRAIN - 1):
        forks.launch_refused("cannot fork: EAGAIN")
    assert forks.not_accepting() is None and told == []
    forks.launch_refused("cannot fork: EAGAIN")
    assert told == ["launches keep failing (the last: cannot fork: EAGAIN)"]
    forks.launch_refused("cannot fork: EAGAIN")  # still not accepting: no news
    assert len(told) == 1
    monkeypatch.setattr(fork_server_link, "DRAIN_RETRY", 0.0)  # its time is up: it tries again
    assert forks.not_accepting() is None
    monkeypatch.setattr(fork_server_link, "DRAIN_RETRY", 30.0)
    forks.set_refusing("the fork server cannot be restarted: test")
    assert told[-1] == "the fork server cannot be restarted: test"
    forks.set_refusing(None)
    forks.failed_launches = 0
    assert forks.not_accepting() is None
