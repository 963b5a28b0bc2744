"""Plain helpers for tests (fixtures live in conftest.py)."""

from __future__ import annotations

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
