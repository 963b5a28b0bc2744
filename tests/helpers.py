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
