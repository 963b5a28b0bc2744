"""Fixtures for end-to-end tests: a running cluster of real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import quit_driver, require_browser, start_chromium
from e2e_cluster import Cluster
from netns import NetnsCluster, TestNetwork, require_netns, start_netns_cluster

from gpuq.cli.fast.helper_control import stop_helpers


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A coordinator and two agents: node a with 4 fake GPUs, node b with 2 (over TCP)."""
    running = Cluster(tmp_path)
    try:
        running.start_coordinator()
        running.start_agent("a", "4xA100-80GB")
        running.start_agent("b", "2xL4-24GB", tcp=True)
        yield running
    finally:
        running.close()


@pytest.fixture
def lone_coordinator(tmp_path: Path) -> Iterator[Cluster]:
    """A coordinator and no agents: what is submitted waits (for what the command line and
    gRPC do with the coordinator's answers; what it decides is tested in process)."""
    running = Cluster(tmp_path)
    try:
        running.start_coordinator()
        yield running
    finally:
        running.close()


@pytest.fixture
def bare_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster with nothing started yet."""
    running = Cluster(tmp_path)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def netns_network() -> Iterator[TestNetwork]:
    """Two network namespaces on a bridge, each with its own address (tests/netns.py)."""
    require_netns()
    with TestNetwork(2) as network:
        yield network


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    """A coordinator on a test bridge and two agents, n0 and n1 (2 fake GPUs each), each in a
    network namespace of its own with its own address (tests/netns.py's NetnsCluster)."""
    require_netns()
    with start_netns_cluster(tmp_path) as running:
        yield running


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium (tests/e2e/browser.py), quit and its profile removed afterwards."""
    require_browser()
    profile = tmp_path / "chromium-profile"
    chromium = start_chromium(profile)
    try:
        yield chromium
    finally:
        quit_driver(chromium, profile)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Path]:
    """A private XDG_RUNTIME_DIR for CLI helpers; the helpers started there are stopped."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    try:
        yield folder
    finally:
        if (folder / "gpuq").exists():
            stop_helpers(folder / "gpuq")
