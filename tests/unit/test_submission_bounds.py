"""Bounded input at the edge: every bad value a user (or a gRPC client) can give is one
InvalidInput naming the field, never another exception; and sbatch's semantics at submit
(#SBATCH lines, CRLF scripts, SLURM's dependency and begin forms, the submitter's umask)."""

from __future__ import annotations

import datetime as dt
import math
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.convert import spec_from_proto, spec_to_proto
from gpuq.domain.array_specs import ArraySpec, format_indices
from gpuq.domain.dependencies import Dependency, DependencyKind, parse_job_ref
from gpuq.domain.limits import (
    MAX_ARRAY_INDEX,
    MAX_ARRAY_TASKS,
    MAX_BEGIN_TIME,
    MAX_JOB_ID,
    MAX_TIME_LIMIT,
    check_name,
)
from gpuq.domain.model import JobSpec, Resources, WarningSignal, parse_signal
from gpuq.domain.parsing import parse_begin, parse_dependencies
from gpuq.domain.units import parse_duration, parse_size
from gpuq.errors import InvalidInput
from gpuq.options import OPTIONS
from gpuq.submission import (
    SubmitWarning,
    build_spec,
    current_umask,
    options_after_script,
    read_script,
)

NOW = dt.datetime(2026, 9, 21, 10, 30).timestamp()  # local time, like the parser
DAY = 86400.0
ANY_TEXT = st.text(max_size=40) | st.from_regex(
    r"(now(\+[0-9]{0,25}[a-z]{0,7})?|[0-9:_%,+-]{0,30}|[0-9]{1,30}[a-zA-Z]{0,3})", fullmatch=True
)


def refused(field: str, call: Any, *args: Any, **kwargs: Any) -> InvalidInput:
    """`call` raises InvalidInput naming `field` (its message stays one short line)."""
    with pytest.raises(InvalidInput) as info:
        call(*args, **kwargs)
    assert info.value.field == field, info.value
    text = str(info.value)
    assert "\n" not in text and len(text) < 400, text
    return info.value


def spec(**options: Any) -> JobSpec:
    options.setdefault("environ", {})
    options.setdefault("chdir", "/tmp")
    options.setdefault("now", NOW)
    if "script" not in options:
        options.setdefault("wrap", "true")
    return build_spec(**options)


# ---- --begin -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "offset"),
    [
        ("now", 0),
        ("NOW", 0),
        ("now+90", 90),
        ("now+90s", 90),
        ("now+30m", 1800),
        ("now+30minutes", 1800),
        ("now+1hour", 3600),
        ("now+2h", 7200),
        ("now+1d", DAY),
        ("now+2days", 2 * DAY),
        ("now+1w", 7 * DAY),
        ("now+2weeks", 14 * DAY),
        ("now+366d", 366 * DAY),
    ],
)
def test_begin_relative(text: str, offset: float) -> None:
    assert parse_begin(text, NOW) == NOW + offset


def test_begin_named_and_clock_times() -> None:
    today = dt.datetime(2026, 9, 21)
    assert parse_begin("today", NOW) == today.timestamp()
    assert parse_begin("tomorrow", NOW) == (today + dt.timedelta(days=1)).timestamp()
    assert parse_begin("16:00", NOW) == today.replace(hour=16).timestamp()
    assert parse_begin("4:00pm", NOW) == today.replace(hour=16).timestamp()
    assert parse_begin("noon", NOW) == today.replace(hour=12).timestamp()
    # already past today: tomorrow at that time
    assert (
        parse_begin("09:15:30", NOW)
        == (today + dt.timedelta(days=1, hours=9, minutes=15, seconds=30)).timestamp()
    )
    assert parse_begin("midnight", NOW) == (today + dt.timedelta(days=1)).timestamp()
    assert parse_begin("12:00am", NOW) == (today + dt.timedelta(days=1)).timestamp()


def test_begin_dates_with_and_without_offsets() -> None:
    assert parse_begin("2026-12-01T09:00", NOW) == dt.datetime(2026, 12, 1, 9).timestamp()
    assert parse_begin("2026-12-01", NOW) == dt.datetime(2026, 12, 1).timestamp()
    aware = dt.datetime(2026, 12, 1, 7, tzinfo=dt.UTC).timestamp()
    assert parse_begin("2026-12-01T09:00+02:00", NOW) == aware
    assert parse_begin("2026-12-01T07:00Z", NOW) == aware
    assert parse_begin("2020-01-01", NOW) == dt.datetime(2020, 1, 1).timestamp()  # past: now


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("now+3000000d", "a year"),
        ("now+367d", "a year"),
        ("now+99999999999999999999d", "a year"),
        ("now+" + "9" * 5000, "a year"),
        ("now+1parsec", "unknown unit"),
        ("now-5", "expected"),
        ("2026-13-01", "expected"),
        ("2028-01-01", "a year"),
        ("9999-12-31T23:59:59", "a year"),
        ("0001-01-01T00:00+00:00", "1970"),
        ("25:00", "time of day"),
        ("13:00pm", "1 to 12"),
        ("yesterday", "expected"),
        ("", "expected"),
        ("x" * 10_000, "expected"),
        ("now+\u0663d", "expected"),
    ],
)
def test_begin_refusals(text: str, why: str) -> None:
    assert why in refused("--begin", parse_begin, text, NOW).problem


@settings(max_examples=400, deadline=None)
@given(ANY_TEXT)
def test_begin_never_raises_anything_else_and_can_always_be_shown(text: str) -> None:
    try:
        moment = parse_begin(text, NOW)
    except InvalidInput as exc:
        assert exc.field == "--begin"
        return
    assert 0 <= moment <= NOW + 366 * DAY and math.isfinite(moment)
    dt.datetime.fromtimestamp(moment).isoformat()  # what the scheduler's reasons do
    JobSpec(name="x", script="#!/bin/sh\n", workdir="/tmp", begin_time=moment)


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, -1.0, MAX_BEGIN_TIME + 1, 10**400, True, "1"]
)
def test_spec_bounds_begin_time(value: Any) -> None:
    refused("--begin", JobSpec, name="x", script="#!/bin/sh\n", workdir="/tmp", begin_time=value)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_accepted_begin_time_can_be_formatted(value: float) -> None:
    try:
        JobSpec(name="x", script="#!/bin/sh\n", workdir="/tmp", begin_time=value)
    except InvalidInput as exc:
        assert exc.field == "--begin"
        return
    dt.datetime.fromtimestamp(value).isoformat(sep=" ", timespec="seconds")


def test_begin_through_build_spec() -> None:
    assert spec(begin="now+1h").begin_time == NOW + 3600
    refused("--begin", spec, begin="now+3000000d")
    assert spec(begin=NOW + 60).begin_time == NOW + 60  # a timestamp from Python


# ---- --signal ------------------------------------------------------------------------------


def test_signal_forms() -> None:
    assert parse_signal("TERM") == signal.SIGTERM
    assert parse_signal("sigusr1") == signal.SIGUSR1
    assert parse_signal("40") == 40  # a real-time signal
    assert WarningSignal.parse("USR1@60") == WarningSignal(int(signal.SIGUSR1), 60)
    assert WarningSignal.parse("10") == WarningSignal(10, 0)
    assert WarningSignal.parse(f"USR2@{MAX_TIME_LIMIT}").seconds == MAX_TIME_LIMIT


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("USR1@99999999999999999", "366 days"),
        (f"USR1@{MAX_TIME_LIMIT + 1}", "366 days"),
        ("USR1@" + "9" * 5000, "366 days"),
        ("USR1@-1", "SIG@SECONDS"),
        ("USR1@1.5", "SIG@SECONDS"),
        ("USR1@", "SIG@SECONDS"),
        ("USR1@\u0663", "SIG@SECONDS"),
        ("KILL", "cannot be caught"),
        ("9@30", "cannot be caught"),
        ("SIGSTOP", "freeze"),
        ("0", "signal number"),
        ("32", "signal number"),
        ("65", "signal number"),
        ("99999999999999999999", "signal number"),
        ("NOPE", "signal name"),
        ("", "signal name"),
        ("SIG" + "A" * 100, "signal name"),
    ],
)
def test_signal_refusals(text: str, why: str) -> None:
    assert why in refused("--signal", WarningSignal.parse, text).problem


@pytest.mark.parametrize(
    ("sig", "seconds"),
    [(9, 0), (19, 0), (0, 0), (65, 0), (32, 0), (10, -1), (10, MAX_TIME_LIMIT + 1), (True, 0)],
)
def test_warning_signal_checks_itself(sig: int, seconds: int) -> None:
    refused("--signal", WarningSignal, sig, seconds)


@given(ANY_TEXT)
def test_signal_parsing_raises_only_invalid_input(text: str) -> None:
    try:
        parsed = WarningSignal.parse(text)
    except InvalidInput as exc:
        assert exc.field == "--signal"
        return
    assert 1 <= parsed.signal <= 64 and 0 <= parsed.seconds <= MAX_TIME_LIMIT


# ---- job ids and --after -------------------------------------------------------------------


def test_job_refs() -> None:
    assert parse_job_ref("42") == (42, None)
    assert parse_job_ref("40_3") == (40, 3)
    assert parse_job_ref("5_0") == (5, 0)
    assert parse_job_ref("007") == (7, None)
    assert parse_job_ref(str(MAX_JOB_ID)) == (MAX_JOB_ID, None)
    assert parse_job_ref(f"1_{MAX_ARRAY_INDEX}") == (1, MAX_ARRAY_INDEX)


@pytest.mark.parametrize(
    "text",
    [
        *(" 5", "5 ", "+5", "\u0665", "\uff15", "-1", "0", "", "5_", "_5", "5_1_2", "5.0", "1e3"),
        *("0x10", "5\n", "9" * 30, str(MAX_JOB_ID + 1), f"5_{MAX_ARRAY_INDEX + 1}", "9" * 5000),
    ],
)
def test_job_refs_are_digits_only_and_bounded(text: str) -> None:
    refused("job id", parse_job_ref, text)
    refused("--after", parse_job_ref, text, "--after")


@given(st.text(max_size=30) | st.from_regex(r"[0-9]{1,25}(_[0-9]{1,12})?", fullmatch=True))
def test_job_refs_round_trip_or_refuse(text: str) -> None:
    try:
        job, task = parse_job_ref(text)
    except InvalidInput as exc:
        assert exc.field == "job id"
        return
    canonical = f"{job}_{task}" if task is not None else str(job)
    assert parse_job_ref(canonical) == (job, task)
    assert 1 <= job <= MAX_JOB_ID and (task is None or 0 <= task <= MAX_ARRAY_INDEX)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40", Dependency(40)),
        ("40:ok", Dependency(40)),
        ("40:OK", Dependency(40)),
        ("40_3", Dependency(40, DependencyKind.OK, 3)),
        ("40_3:any", Dependency(40, DependencyKind.ANY, 3)),
        ("12:notok", Dependency(12, DependencyKind.NOTOK)),
        ("afterok:12", Dependency(12)),
        ("afternotok:12", Dependency(12, DependencyKind.NOTOK)),
        ("afterany:40_3", Dependency(40, DependencyKind.ANY, 3)),
        (" 40 ", Dependency(40)),
    ],
)
def test_dependency_forms(text: str, expected: Dependency) -> None:
    assert Dependency.parse(text) == expected


def test_slurm_dependency_lists_and_singleton() -> None:
    deps, singleton = parse_dependencies("afterok:12:13,afterany:14,singleton")
    assert deps == (
        Dependency(12),
        Dependency(13),
        Dependency(14, DependencyKind.ANY),
    )
    assert singleton
    assert parse_dependencies("singleton") == ((), True)
    assert parse_dependencies("40_3:any,41") == (
        (Dependency(40, DependencyKind.ANY, 3), Dependency(41)),
        False,
    )
    built = spec(after=("afterok:12:13", "singleton", "12"))
    assert built.dependencies == (Dependency(12), Dependency(13)) and built.singleton


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("after:12", "after: (start once JOB has started) is not supported"),
        ("12?13", "'?'"),
        ("afterok:12?afterany:13", "'?'"),
        ("aftercorr:12", "aftercorr is not supported"),
        ("afterok:", "afterok:JOB"),
        ("afterok:12+60", "expected a job id"),
        ("12:maybe", "ok, any or notok"),
        ("x", "unknown dependency type"),
        ("0", "job ids go from 1"),
        ("-3", "expected a job id"),
        ("5_0:any:x", "ok, any or notok"),
        ("", "expected"),
        ("12,", "expected"),
        ("afterok:" + ":".join(map(str, range(1, 1100))), "more than 1000"),
    ],
)
def test_dependency_refusals_say_what_is_supported(text: str, why: str) -> None:
    assert why in refused("--after", parse_dependencies, text).problem


@given(ANY_TEXT)
def test_dependency_parsing_raises_only_invalid_input(text: str) -> None:
    try:
        parse_dependencies(text)
    except InvalidInput as exc:
        assert exc.field == "--after"


# ---- --array -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0-99999999999:1", "task indices go from 0"),
        ("0-99999999999999999999999999999999", "task indices go from 0"),
        (f"0-{MAX_ARRAY_INDEX + 1}", "task indices go from 0"),
        ("0-99999,100000-199999", f"more than {MAX_ARRAY_TASKS}"),
        (f"0-{MAX_ARRAY_TASKS}", f"more than {MAX_ARRAY_TASKS}"),
        ("0-99%0", "limit"),
        (f"0-99%{MAX_ARRAY_TASKS + 1}", "limit"),
        ("0-99%99999999999999999999", "limit"),
        ("0-99%", "expected"),
        ("5-1", "goes down"),
        ("1-2:0", "step"),
        ("5:2", "expected"),
        ("1_0", "expected"),
        ("+5", "expected"),
        ("\u0665", "expected"),
        ("1,,2", "expected"),
        ("-1", "expected"),
    ],
)
def test_array_refusals(text: str, why: str) -> None:
    started = time.perf_counter()
    error = refused("--array", ArraySpec.parse, text)
    assert why in error.problem
    assert time.perf_counter() - started < 0.5, "refused before building anything big"


def test_array_steps_beyond_the_range() -> None:
    assert ArraySpec.parse("0-10:99999999999").indices == (0,)
    assert ArraySpec.parse("0-5,3-9").indices == tuple(range(10))
    assert ArraySpec.parse(f"0-{MAX_ARRAY_TASKS - 1}%5").max_running == 5


@pytest.mark.parametrize(
    "indices",
    [(), (-1,), (MAX_ARRAY_INDEX + 1,), (1, 1), (True,), tuple(range(MAX_ARRAY_TASKS + 1))],
)
def test_array_spec_checks_itself(indices: tuple[int, ...]) -> None:
    refused("--array", ArraySpec, indices)


def test_array_limit_checks_itself() -> None:
    refused("--array limit", ArraySpec, (1, 2), 0)


@given(ANY_TEXT)
def test_array_parsing_raises_only_invalid_input(text: str) -> None:
    try:
        parsed = ArraySpec.parse(text)
    except InvalidInput as exc:
        assert exc.field.startswith("--array")
        return
    assert ArraySpec.parse(format_indices(parsed.indices)).indices == parsed.indices


@given(st.sets(st.integers(0, MAX_ARRAY_INDEX), min_size=1, max_size=50))
def test_stored_indices_round_trip(indices: set[int]) -> None:
    ordered = tuple(sorted(indices))
    assert ArraySpec.parse(format_indices(ordered)).indices == ordered


# ---- sizes, durations, numbers -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "99999999999999T",
        "-1",
        "1e400",
        "nan",
        "inf",
        "NaN",
        "1" * 100,
        "\u0661\u0662G",
        "2049P",
        "0.5B",
    ],
)
def test_mem_refusals(text: str) -> None:
    refused("--mem", parse_size, text, "--mem")
    refused("--mem", spec, mem=text)


def test_mem_bound_is_1024p() -> None:
    assert parse_size("1024P") == 2**60
    refused("--mem", spec, mem=2**61)
    refused("--gpu-mem", spec, gpus=1, gpu_mem="2P")


@given(ANY_TEXT)
def test_size_parsing_raises_only_invalid_input(text: str) -> None:
    try:
        value = parse_size(text, "--mem")
    except InvalidInput as exc:
        assert exc.field == "--mem"
        return
    assert 1 <= value <= 2**60


@pytest.mark.parametrize(
    "text",
    ["99999999999999999999", "0", "-5", "00:00", "1-24", "\u0661\u0662", "9" * 5000, "1:2:3:4"],
)
def test_time_refusals(text: str) -> None:
    refused("--time", spec, time=text)


def test_time_bound_is_366_days() -> None:
    assert spec(time="366-00:00:00").resources.time_limit == MAX_TIME_LIMIT
    assert "366 days" in refused("--time", spec, time="366-00:00:01").problem
    assert "366 days" in refused("--time", spec, time="9999999999").problem


@given(ANY_TEXT)
def test_duration_parsing_raises_only_invalid_input(text: str) -> None:
    try:
        assert parse_duration(text, "--time") > 0
    except InvalidInput as exc:
        assert exc.field == "--time"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("gpus", "99999999999999999999999"),
        ("gpus", "9" * 5000),
        ("gpus", "1025"),
        ("gpus", "-1"),
        ("gpus", "\u0663"),
        ("gpus", "2.0"),
        ("cpus", "0"),
        ("cpus", "65537"),
        ("nice", "10001"),
        ("nice", "-10001"),
    ],
)
def test_numbers_are_bounded(option: str, value: str) -> None:
    refused(f"--{option}", spec, **{option: value})


# ---- text: names, paths, qos, environment, arguments ---------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a\nb", "control character"),
        ("ab\n", "control character"),
        ("a\x1b[31m", "control character"),
        ("a\u202eb", "control character"),  # a bidi override would reorder what follows
        ("zero\u200bwidth", "unprintable character"),
        ("bad\udcff", "unprintable character"),
        ("x" * 129, "longer than 128"),
        ("", "empty"),
    ],
)
def test_names_refused(name: str, why: str) -> None:
    assert why in refused("--name", check_name, name).problem
    if name:  # an empty --name means the default one
        assert why in refused("--name", spec, name=name).problem


@pytest.mark.parametrize(
    "name", ["CS 601.471/671 homework5", "sweep *", "café", "训练", "a" * 128, "it's \\ ok"]
)
def test_names_take_any_printable_text_as_slurm_does(name: str) -> None:
    assert check_name(name) == name
    assert spec(name=name).name == name


@pytest.mark.parametrize("option", ["output", "error"])
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("out\n.txt", "control character"),
        ("out\0.txt", "NUL"),
        ("o" * 4097, "longer than 4096"),
        ("é" * 2049, "longer than 4096"),
        ("bad\udcff", "UTF-8"),
    ],
)
def test_output_patterns(option: str, value: str, why: str) -> None:
    assert why in refused(f"--{option}", spec, **{option: value}).problem


def test_output_patterns_may_be_any_path() -> None:
    assert spec(output="résultats/%x-%j.out").output == "résultats/%x-%j.out"


def test_chdir() -> None:
    assert spec(chdir="/tmp/x").workdir == "/tmp/x"
    assert spec(chdir="rel").workdir == str(Path("rel").absolute())
    refused("workdir", spec, chdir="/tmp/a\nb")
    refused("workdir", spec, chdir="/tmp/a\0b")
    refused("workdir", spec, chdir="/" + "d" * 5000)


@pytest.mark.parametrize("qos", ["hi gh", "q" * 65, "hïgh", "a\nb", "x;y"])
def test_qos_is_plain_text(qos: str) -> None:
    refused("--qos", spec, qos=qos)


@pytest.mark.parametrize(
    ("item", "why"),
    [
        ("1A=x", "letters, digits"),
        ("A-B=x", "letters, digits"),
        ("A B=x", "letters, digits"),
        ("=x", "K=V"),
        ("A", "K=V"),
        ("A=x\0y", "NUL"),
    ],
)
def test_env_assignments(item: str, why: str) -> None:
    assert why in refused("--env", spec, env=(item,)).problem


def test_carried_environment() -> None:
    carried = {
        "PATH": "/bin",
        "BASH_FUNC_module%%": "() { :; }",  # exported shell functions travel, as with sbatch
        "": "x",
        "A=B": "x",
        "NUL": "a\0b",
        "BYTES": "caf\udce9",  # not UTF-8 in the real environment: cannot travel
    }
    env = spec(environ=carried, env=("X=1",)).env
    assert env == {"PATH": "/bin", "BASH_FUNC_module%%": "() { :; }", "X": "1"}
    assert spec(environ=carried, export="NONE", env=("X=1",)).env == {"X": "1"}
    assert spec(environ=carried, export="ALL,Y=2").env["Y"] == "2"
    refused("--export", spec, export="PATH,HOME")


def test_environment_is_bounded() -> None:
    huge = {f"BIG{i}": "x" * 110_000 for i in range(10)}
    error = refused("--env", spec, environ=huge)
    assert "larger than 1 MiB" in error.problem and "--export NONE" in error.problem
    refused("--env", JobSpec, name="x", script="#!/bin/sh\n", workdir="/tmp", env=huge)
    assert len(spec(environ=huge, export="NONE").env) == 0
    error = refused("--env", spec, env=("ONE=" + "x" * (128 << 10),))
    assert "128 KiB" in error.problem
    refused("--env", JobSpec, name="x", script="#!/bin/sh\n", workdir="/tmp", env={"A": "\udcff"})


def test_arguments_are_bounded() -> None:
    assert spec(args=("a b", "line\nbreak", "é")).args == ("a b", "line\nbreak", "é")
    refused("argument", spec, args=("a\0b",))
    refused("argument", spec, args=("\udcff",))
    refused("arguments", spec, args=("x",) * 5000)
    refused("arguments", spec, args=("x" * 120_000,) * 9)
    assert "128 KiB" in refused("argument", spec, args=("x" * (128 << 10),)).problem


def test_script_bounds(tmp_path: Path) -> None:
    crlf = tmp_path / "dos.sh"
    crlf.write_bytes(b"#!/bin/bash\r\necho hi\r\n")
    error = refused("script", read_script, str(crlf))
    assert "DOS line ends (CRLF)" in error.problem and "dos2unix" in error.problem
    refused("script", spec, script=str(crlf))
    refused("script", spec, script="a\0b")
    refused("script", spec, wrap="echo a\0b")
    big = tmp_path / "big.sh"
    big.write_text("#!/bin/sh\n" + "#" * (4 << 20))
    refused("script", spec, script=str(big))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([o.name for o in OPTIONS if not o.is_flag]),
    ANY_TEXT | st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
)
def test_any_text_for_any_option_is_a_spec_or_one_invalid_input(name: str, text: str) -> None:
    value: Any = (text,) if name in ("after", "env") else text
    try:
        built = spec(**{name: value}, warnings=[])  # a warning is fine; one line, not an error
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert spec_from_proto(spec_to_proto(built)) == built


# ---- over gRPC: the dataclasses check what spec_from_proto builds -------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: setattr(m, "begin_time", math.nan), "--begin"),
        (lambda m: setattr(m, "begin_time", 1e300), "--begin"),
        (lambda m: m.signal.CopyFrom(type(m.signal)(signal=9, seconds=0)), "--signal"),
        (lambda m: m.signal.CopyFrom(type(m.signal)(signal=10, seconds=2**32 - 1)), "--signal"),
        (lambda m: m.array.CopyFrom(type(m.array)(indices=[2**32 - 1])), "--array"),
        (lambda m: m.dependencies.add(job_id=2**64 - 1, kind="ok"), "--after"),
        (lambda m: m.dependencies.add(job_id=5, kind="ok", task=2**32 - 1), "--after task"),
        (lambda m: setattr(m, "name", "a\nb"), "--name"),
        (lambda m: setattr(m, "qos", "x" * 100), "--qos"),
        (lambda m: setattr(m, "output", "a\nb"), "--output"),
        (lambda m: m.env.update({f"BIG{i}": "x" * 110_000 for i in range(10)}), "--env"),
        (lambda m: m.env.update({"ONE": "x" * (128 << 10)}), "--env"),
        (lambda m: m.args.extend(["x"] * 5000), "arguments"),
        (lambda m: setattr(m, "nice", 2**31 - 1), "--nice"),
        (lambda m: setattr(m.resources, "gpus", 2**32 - 1), "--gpus"),
        (lambda m: setattr(m.resources, "mem", 2**64 - 1), "--mem"),
        (lambda m: setattr(m.resources, "time_limit", 2**64 - 1), "--time"),
    ],
)
def test_grpc_specs_are_checked_too(change: Any, field: str) -> None:
    message = spec_to_proto(spec())
    change(message)
    refused(field, spec_from_proto, message)


# ---- #SBATCH and #GPUQ lines ---------------------------------------------------------------


def write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + body)
    return str(path)


def test_sbatch_lines_are_read(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "#SBATCH --gpus=2 -c 4 --mem=40G\n"
        "#SBATCH -t 1:00:00 -J sb --output=o-%j.txt -e e-%j.txt\n"
        "#SBATCH --qos=high --array=0-3%2 -d afterok:12:13 --hold\n"
        "#SBATCH --begin=now+1h --signal=USR1@60 --no-requeue -D /tmp/w --nice=5\n"
        "#SBATCH --nodes=1 -n 1 --requeue   # sbatch's comments too\n"
        "echo hi\n",
    )
    notes: list[str] = []
    built = spec(script=script, warnings=notes, chdir=None)
    assert notes == []
    # `-n 1` asks for tasks: SLURM_NTASKS is set, as sbatch does
    assert built.resources == Resources(
        gpus=2, cpus=4, mem=40 << 30, time_limit=3600, explicit_tasks=True
    )
    assert (built.name, built.output, built.error, built.qos) == (
        "sb",
        "o-%j.txt",
        "e-%j.txt",
        "high",
    )
    assert built.array == ArraySpec((0, 1, 2, 3), 2)
    assert built.dependencies == (Dependency(12), Dependency(13))
    assert built.hold and not built.requeue and built.nice == 5 and built.workdir == "/tmp/w"
    assert built.begin_time == NOW + 3600 and built.signal == WarningSignal(10, 60)


def test_sbatch_gres_and_gpu_types(tmp_path: Path) -> None:
    notes: list[str] = []
    built = spec(script=write(tmp_path, "#SBATCH --gres=gpu:a100:2\n"), warnings=notes)
    assert (built.resources.gpu_type, built.resources.gpus) == ("a100", 2)
    assert notes == []
    bare = spec(script=write(tmp_path, "#SBATCH --gres=gpu:h100\n")).resources
    assert (bare.gpu_type, bare.gpus) == ("h100", 1)
    assert spec(script=write(tmp_path, "#SBATCH --gres=gpu:3\n")).resources.gpus == 3
    assert spec(script=write(tmp_path, "#SBATCH --gres=gpu\n")).resources.gpus == 1
    typed = spec(script=write(tmp_path, "#SBATCH -G a100:2\n"), warnings=[]).resources
    assert (typed.gpu_type, typed.gpus) == ("a100", 2)
    assert spec(script=write(tmp_path, "#SBATCH --gpus-per-node=4\n")).resources.gpus == 4
    assert spec(script=write(tmp_path, "#SBATCH -c4\n")).resources.cpus == 4
    assert spec(script=write(tmp_path, "#SBATCH --nice\n")).nice == 100


def test_sbatch_options_gpuq_does_not_use_are_warnings(tmp_path: Path) -> None:
    notes: list[str] = []
    built = spec(
        script=write(
            tmp_path,
            "#SBATCH --account=x\n"
            "#SBATCH -A lab --exclusive=other\n"
            "#SBATCH --mem-bind=local --time=UNLIMITED --export=HOME\n"
            '#SBATCH --comment="unbalanced\n'
            "#SBATCH --gres=gpu:1,shard:2\n",
        ),
        warnings=notes,
    )
    assert built.resources.gpus == 1 and built.resources.mem is None
    assert notes == [
        "#SBATCH --account=x (line 2) is not used by gpuq",
        "#SBATCH -A lab (line 3) is not used by gpuq",
        "#SBATCH --exclusive=other (line 3) is not used by gpuq: expected user or mcs",
        "#SBATCH --mem-bind=local (line 4) is not used by gpuq",
        "#SBATCH --time=UNLIMITED (line 4) is not used by gpuq: the default time limit applies",
        "#SBATCH --export=HOME (line 4) is not used by gpuq: only ALL or NONE (then K=V items) "
        "are; your whole environment is carried",
        "#SBATCH line 5 is not used by gpuq: No closing quotation",
        "#SBATCH --gres=gpu:1,shard:2 (line 6): shard:2 is not used by gpuq",
    ]


def test_without_a_list_warnings_are_python_warnings(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec(script=write(tmp_path, "#SBATCH --account=x\n"))
    assert [str(w.message) for w in caught if w.category is SubmitWarning] == [
        "#SBATCH --account=x (line 2) is not used by gpuq"
    ]


def test_gpuq_lines_win_over_sbatch_and_flags_over_both(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "#SBATCH --gpus=1 --cpus-per-task=2 --job-name=sb --dependency=afterok:5\n"
        "#GPUQ --gpus 3 --name gq --after 6\n"
        "echo hi\n"
        "#SBATCH --qos=high\n",  # after the first command: not a directive
    )
    built = spec(script=script)
    assert (built.resources.gpus, built.resources.cpus, built.name, built.qos) == (3, 2, "gq", None)
    assert built.dependencies == (Dependency(5), Dependency(6))  # repeatable ones add up
    flagged = spec(script=script, gpus="4", name="cli")
    assert (flagged.resources.gpus, flagged.name) == (4, "cli")


def test_sbatchs_long_names_for_the_name_and_dependencies_work_everywhere(tmp_path: Path) -> None:
    """`--job-name` and `--dependency`, as a SLURM user types them, on gpuq submit's command
    line (as unambiguous prefixes too, as sbatch takes them) and in #GPUQ lines, beside gpuq's
    own --name and --after."""
    from gpuq.cli.job_verbs import submit

    args = ["--job-name", "train", "--dependency=afterok:5", "--dep", "7", "--wrap", "true"]
    context = submit.make_context("submit", args)
    assert context.params["name"] == "train" and context.params["after"] == ("afterok:5", "7")
    script = write(tmp_path, "#GPUQ --job-name gq --dependency afterany:6\necho hi\n")
    built = spec(script=script)
    assert built.name == "gq"
    assert built.dependencies == (Dependency(6, DependencyKind.ANY),)


def test_bad_values_in_directives_name_their_line(tmp_path: Path) -> None:
    # named as the line wrote it: -G, not --gpus; --dependency, not gpuq's --after
    error = refused("-G (#SBATCH line 2)", spec, script=write(tmp_path, "#SBATCH -G 2x\n"))
    assert error.value == "2x"
    refused("-d (#SBATCH line 2)", spec, script=write(tmp_path, "#SBATCH -d after:12\n"))
    script = write(tmp_path, "#SBATCH --dependency=after:12\n")
    refused("--dependency (#SBATCH line 2)", spec, script=script)
    script = write(tmp_path, "#SBATCH --gpus-per-node=x:y\n")
    refused("--gpus-per-node (#SBATCH line 2)", spec, script=script)
    refused("--gres (#SBATCH line 2)", spec, script=write(tmp_path, "#SBATCH --gres=gpu:-1\n"))
    refused("-t (#GPUQ line 3)", spec, script=write(tmp_path, "#SBATCH -t 5\n#GPUQ -t x\n"))
    refused("--env (#GPUQ line 2)", spec, script=write(tmp_path, "#GPUQ --env 1A=x\n"))
    refused("#SBATCH (line 2)", spec, script=write(tmp_path, "#SBATCH --hold=yes\n"))
    refused("#SBATCH (line 2)", spec, script=write(tmp_path, "#SBATCH --qos\n"))
    # the command line's value is the one refused, without a line
    refused("--gpus", spec, script=write(tmp_path, "#SBATCH -G 1\n"), gpus="x:y")
    refused("-G", spec, script=write(tmp_path, "#SBATCH -G 1\n"), gpus="-1", spelled={"gpus": "-G"})


# ---- the rest of sbatch's behaviour --------------------------------------------------------


def test_the_submitters_umask_is_recorded() -> None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            expected = int(line.split()[1], 8)
    assert current_umask() == expected
    assert spec().umask == expected


def test_options_after_the_script() -> None:
    args = ("--lr", "0.1", "--gpus", "2", "--time=5", "-c", "x.yaml", "--wait", "--", "--mem")
    assert options_after_script(args) == ["--gpus", "--time", "--wait"]
    assert options_after_script(("--gpusx", "gpus", "-G")) == []


# ---- sizes at the edge (issue 11) -------------------------------------------------------------


def _largest_spec() -> JobSpec:
    """A spec with every part at (or just under) its limit, the env in its costliest form on
    the wire (many tiny variables)."""
    from gpuq.domain.limits import MAX_ARGS, MAX_ENV_BYTES, MAX_PATH_BYTES, MAX_SCRIPT_BYTES

    env: dict[str, str] = {}
    total = 0
    i = 0
    while True:
        key = format(i, "x")
        if total + len(key) + 2 > MAX_ENV_BYTES:
            break
        env[key] = ""
        total += len(key) + 2
        i += 1
    arg = "a" * (((1 << 20) // MAX_ARGS) - 1)
    path = "/" + "p" * (MAX_PATH_BYTES - 1)
    return JobSpec(
        name="n" * 128,
        script="#!/bin/sh\n" + "#" * (MAX_SCRIPT_BYTES - 10),
        workdir=path,
        args=(arg,) * MAX_ARGS,
        env=env,
        output=path,
        error=path,
        source=path,
        array=ArraySpec(
            tuple(range(MAX_ARRAY_INDEX - MAX_ARRAY_TASKS + 1, MAX_ARRAY_INDEX + 1)), 5
        ),
        dependencies=tuple(
            Dependency(MAX_JOB_ID - i, DependencyKind.ANY, MAX_ARRAY_INDEX) for i in range(1000)
        ),
        begin_time=MAX_BEGIN_TIME,
        signal=WarningSignal(10, 60),
        resources=Resources(gpus=1024, gpu_mem=1 << 40, cpus=65536, mem=1 << 50, time_limit=60),
        qos="q" * 64,
        nice=-10_000,
        umask=0o777,
    )


def test_the_largest_valid_request_fits_the_receive_limits() -> None:
    from gpuq.domain.limits import MAX_AGENT_MESSAGE_BYTES, MAX_REQUEST_BYTES
    from gpuq.v1 import agent_pb2, queue_pb2

    message = spec_to_proto(_largest_spec())
    assert spec_from_proto(message) is not None  # valid as it arrives
    request = queue_pb2.SubmitRequest(spec=message, request_key="k" * 64)
    assert 6 << 20 < request.ByteSize() <= MAX_REQUEST_BYTES
    launch = agent_pb2.JobLaunch(
        job_id=MAX_JOB_ID,
        spec=message,
        gpus=[f"MIG-GPU-{'f' * 36}/{i}/0" for i in range(1024)],
        user="u" * 32,
        array_job_id=MAX_JOB_ID,
        array_task_id=MAX_ARRAY_INDEX,
        time_limit=2**63,
        kill_grace=1e300,
        requeue_count=2**32 - 1,
        attempt=2**32 - 1,
    )
    alone = agent_pb2.CoordinatorMessage(start=[launch], ack=[MAX_JOB_ID] * 1000)
    assert alone.ByteSize() <= MAX_AGENT_MESSAGE_BYTES
    assert MAX_REQUEST_BYTES <= MAX_AGENT_MESSAGE_BYTES


def test_the_largest_valid_registration_fits_the_coordinators_receive_limit() -> None:
    from gpuq.coordinator.nodes.agent_input import MAX_NODE_BYTES, MAX_NODE_CPUS, check_registration
    from gpuq.domain.limits import MAX_NODE_UNITS, MAX_REQUEST_BYTES, MAX_TOPOLOGY_LINKS
    from gpuq.v1 import agent_pb2
    from gpuq.v1 import types_pb2 as pb

    uuid = "G" * 96
    message = agent_pb2.Register(
        node="n" * 63,
        gpus=[
            pb.GpuUnit(
                uuid=uuid,
                index=1024,
                name="m" * 300,
                memory=MAX_NODE_BYTES,
                pci_bus_id=uuid,
                parent_uuid=uuid,
                mig_profile=uuid,
            )
        ]
        * MAX_NODE_UNITS,
        topology=[pb.TopologyLink(a=uuid, b=uuid, distance=2**32 - 1)] * MAX_TOPOLOGY_LINKS,
        cpus=MAX_NODE_CPUS,
        mem=MAX_NODE_BYTES,
        driver="d" * 300,
        isolation="i" * 300,
        gpu_problem="p" * 300,
        version="v" * 300,
    )
    check_registration(message)
    reports = [agent_pb2.JobReport(job_id=MAX_JOB_ID, kind="ENDED", at=1.0, attempt=9)] * 10_000
    message.jobs.extend(reports)  # ten thousand jobs' ends kept over a restart
    assert agent_pb2.AgentMessage(register=message).ByteSize() <= MAX_REQUEST_BYTES


def test_a_script_is_bounded_in_bytes_not_characters() -> None:
    from gpuq.domain.limits import MAX_SCRIPT_BYTES

    fits = "#!/bin/sh\n" + "é" * ((MAX_SCRIPT_BYTES - 10) // 2)
    JobSpec(name="x", script=fits, workdir="/tmp")
    with pytest.raises(InvalidInput, match="larger than 4 MiB"):
        JobSpec(name="x", script=fits + "é", workdir="/tmp")
    with pytest.raises(InvalidInput, match="UTF-8"):
        JobSpec(name="x", script="#!/bin/sh\n\ud800", workdir="/tmp")


def test_an_agent_session_splits_launches_to_fit_one_message() -> None:
    import asyncio

    from gpuq.coordinator.nodes.agent_session import AgentSession
    from gpuq.v1 import agent_pb2

    def launch(job_id: int, size: int) -> agent_pb2.JobLaunch:
        script = "#!/bin/sh\n" + "x" * size
        return agent_pb2.JobLaunch(job_id=job_id, spec=spec_to_proto(JobSpec("x", script, "/")))

    async def run() -> list[agent_pb2.CoordinatorMessage]:
        session = AgentSession("n", max_bytes=10_000)
        session.registered(1.0)
        session.start([launch(1, 3000), launch(2, 3000), launch(3, 3000), launch(4, 3000)])
        session.start([launch(5, 20_000)])  # larger than a message: it travels alone
        session.stop([agent_pb2.StopJob(job_id=1)])
        session.ack([7, 8])
        messages = []
        while True:
            message = await asyncio.wait_for(session.next_message(), 1)
            assert message is not None
            messages.append(message)
            if message.ack:
                break
        session.start([launch(6, 10)])
        messages.append(await asyncio.wait_for(session.next_message(), 1))  # type: ignore[arg-type]
        return messages

    messages = asyncio.run(run())
    starts = [[s.job_id for s in m.start] for m in messages]
    assert starts == [[1, 2, 3], [4], [5], [], [6]]
    assert messages[0].HasField("registered")
    assert [s.job_id for s in messages[3].stop] == [1] and list(messages[3].ack) == [7, 8]
    assert all(m.ByteSize() <= 10_000 for i, m in enumerate(messages) if i != 2)
