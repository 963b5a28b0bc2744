"""Plain helpers for tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import NoReturn

import pytest

from gpuq.domain.model import JobSpec, Resources


def make_spec(name: str = "job", gpus: int = 0, **kwargs: object) -> JobSpec:
    resources = kwargs.pop("resources", None) or Resources(gpus=gpus)
    return JobSpec(
        name=name,
        script="#!/bin/sh\ntrue\n",
        workdir="/tmp",
        resources=resources,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


# a Prometheus exposition as {(sample name, labels): value} (gpuq.coordinator.metrics' tests)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metric_samples(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric_value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when the exposition has no such sample."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll `condition` on the running event loop until it holds; fail at the deadline (a
    wait for something that happens, never a fixed sleep that hopes it did)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, (
            f"timed out after {timeout} s waiting for {what or condition}"
        )
        await asyncio.sleep(0.01)


# ---- skips that CI must never take ------------------------------------------------------------
# CI (.ci/run, with CI=true) runs as root, with PostgreSQL (GPUQ_TEST_PG_URL), Chromium and its
# driver, systemd-analyze and gcc, on machines with cgroup v1's memory and devices controllers,
# no NVIDIA driver or GPU, and systemd not PID 1. A test that needs any of these skips where it
# is missing, except under CI, where a missing one is an error in CI, not a reason to skip.


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for `reason`; under CI=true fail it instead: CI must run it."""
    __tracebackhide__ = True  # reported where it was called, not here
    if in_ci():
        pytest.fail(f"CI=true, but {reason}: CI must run this test, not skip it")
    pytest.skip(reason)


def needs(ok: bool, reason: str) -> pytest.MarkDecorator:
    """The CI-guarded pytest.mark.skipif(not ok, reason=reason): unless `ok`, the test is
    skipped, or under CI=true fails, before its fixtures are set up (tests/conftest.py's
    pytest_runtest_setup)."""
    return pytest.mark.needs(ok, reason)
