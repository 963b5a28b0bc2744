"""Validation of what users ask for, and the spec's JSON form."""

from __future__ import annotations

import signal

import pytest
from helpers import make_spec
from hypothesis import given
from hypothesis import strategies as st

from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.codec import spec_from_dict, spec_to_dict
from gpuq.domain.dependencies import Dependency, DependencyKind
from gpuq.domain.model import JobSpec, Resources, WarningSignal, parse_signal
from gpuq.errors import InvalidInput


def test_array_forms() -> None:
    assert ArraySpec.parse("0-3") == ArraySpec((0, 1, 2, 3))
    assert ArraySpec.parse("0-99%8") == ArraySpec(tuple(range(100)), 8)
    assert ArraySpec.parse("1,3,5-7") == ArraySpec((1, 3, 5, 6, 7))
    assert ArraySpec.parse("0-15:4") == ArraySpec((0, 4, 8, 12))


@pytest.mark.parametrize("text", ["", "a", "5-1", "0-10%0", "0-10%x", "1-2:0", "0-999999999"])
def test_bad_arrays(text: str) -> None:
    with pytest.raises(InvalidInput, match="--array"):
        ArraySpec.parse(text)


def test_dependencies() -> None:
    assert Dependency.parse("12") == Dependency(12, DependencyKind.OK)
    assert Dependency.parse("12:any") == Dependency(12, DependencyKind.ANY)
    assert Dependency.parse("12:notok").kind is DependencyKind.NOTOK
    for bad in ("", "x", "12:maybe", "0", "-3"):
        with pytest.raises(InvalidInput, match="--after"):
            Dependency.parse(bad)


def test_signals() -> None:
    assert parse_signal("TERM") == signal.SIGTERM
    assert parse_signal("sigusr1") == signal.SIGUSR1
    assert parse_signal("9") == signal.SIGKILL
    assert WarningSignal.parse("USR1@60") == WarningSignal(int(signal.SIGUSR1), 60)
    for bad in ("NOPE", "999", "USR1@x"):
        with pytest.raises(InvalidInput):
            WarningSignal.parse(bad)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpus": -1}, "--gpus"),
        ({"cpus": 0}, "--cpus"),
        ({"gpus": 0, "gpu_mem": 1024}, "--gpu-mem"),
        ({"mem": 0}, "--mem"),
        ({"time_limit": 0}, "--time"),
    ],
)
def test_resources_refuse_nonsense(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        Resources(**kwargs)
    assert info.value.field == field


def test_spec_needs_a_shebang_and_an_absolute_workdir() -> None:
    with pytest.raises(InvalidInput, match="#!"):
        JobSpec(name="x", script="echo hi\n", workdir="/tmp", source="job.sh")
    with pytest.raises(InvalidInput, match="workdir"):
        JobSpec(name="x", script="#!/bin/sh\n", workdir="relative")
    with pytest.raises(InvalidInput, match="--name"):
        JobSpec(name="new\nline", script="#!/bin/sh\n", workdir="/tmp")
    with pytest.raises(InvalidInput, match="--env"):
        JobSpec(name="x", script="#!/bin/sh\n", workdir="/tmp", env={"A=B": "1"})


names = st.text(alphabet="abcdefXYZ0123_-.", min_size=1, max_size=20)


@given(
    name=names,
    gpus=st.integers(0, 8),
    env=st.dictionaries(names, st.text(max_size=20).filter(lambda s: "\0" not in s), max_size=4),
    args=st.lists(st.text(max_size=10).filter(lambda s: "\0" not in s), max_size=3),
    array=st.none()
    | st.builds(
        ArraySpec,
        st.lists(st.integers(0, 1000), min_size=1, max_size=5, unique=True).map(tuple),
        st.none() | st.integers(1, 4),
    ),
    deps=st.lists(
        st.builds(Dependency, st.integers(1, 99), st.sampled_from(DependencyKind)), max_size=3
    ),
    hold=st.booleans(),
    begin=st.none() | st.floats(0, 2e9),
    sig=st.none() | st.builds(WarningSignal, st.sampled_from([10, 12, 15]), st.integers(0, 600)),
)
def test_spec_json_round_trip(
    name: str,
    gpus: int,
    env: dict[str, str],
    args: list[str],
    array: ArraySpec | None,
    deps: list[Dependency],
    hold: bool,
    begin: float | None,
    sig: WarningSignal | None,
) -> None:
    spec = make_spec(
        name,
        gpus=gpus,
        env=env,
        args=tuple(args),
        array=array,
        dependencies=tuple(deps),
        hold=hold,
        begin_time=begin,
        signal=sig,
        qos="low",
        output="o-%j",
        requeue=False,
    )
    assert spec_from_dict(spec_to_dict(spec)) == spec
