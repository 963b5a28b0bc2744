"""Listings as people use them (issue 13 part 5), the pure parts: the --format parser, the
column layout that fits 80 columns, colour decisions, name patterns, date parsing and the
server's checks of a listing's filters."""

from __future__ import annotations

import fnmatch
import io
import re

import pytest

from gpuq.cli import render
from gpuq.cli.listings import parse_since
from gpuq.cli.render import Column, Field, fit_widths, layout, parse_format
from gpuq.coordinator.front.listing_filters import list_filters
from gpuq.domain.patterns import compile_patterns, to_posix_regex
from gpuq.errors import InvalidInput
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

# ---- --format ---------------------------------------------------------------------------------


def test_format_reads_squeue_codes_widths_and_literals() -> None:
    assert parse_format("%.10i %-20j|%t%%") == [
        Field("i", 10, True),
        " ",
        Field("j", 20, False),
        "|",
        Field("t"),
        "%",
    ]
    assert parse_format("id=%i") == ["id=", Field("i")]


@pytest.mark.parametrize("bad", ["%Z", "%i %", "%.x", "50%", "%.99999999999i"])
def test_format_refuses_unknown_codes(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_format(bad)


def job(**fields: object) -> pb.Job:
    message = pb.Job(id=7, user="alice", state="running", qos="normal", node="a", submit_time=1.0)
    message.spec.name = str(fields.pop("name", "train"))
    message.spec.resources.gpus = 2
    message.spec.resources.gpu_type = str(fields.pop("gpu_type", ""))
    for key, value in fields.items():
        setattr(message, key, value)
    return message


def test_format_lines_cut_pad_and_colour_after_padding() -> None:
    parts = parse_format("%.4i %-6j %t %b")
    lines = render.format_lines(parts, [job(name="a-long-name")], 100.0, colour=True)
    assert lines[0] == "JOBI NAME   ST TRES_PER_NODE"
    assert lines[1] == "   7 a-long \x1b[32mR \x1b[0m gpu:2"
    bare = render.format_lines(parts, [job(gpu_type="a100")], 0.0, header=False)
    assert bare == ["   7 train  R gpu:a100:2"]  # no width: as wide as its longest value


def test_every_format_code_has_a_value() -> None:
    for code in render.FORMAT_CODES:
        assert isinstance(render.field_value(job(), code, 10.0), str)


def test_format_escapes_what_users_wrote() -> None:
    [_, line] = render.format_lines(parse_format("%j"), [job(name="x\x1b[2Jy")], 0.0)
    assert "\x1b" not in line


# ---- column layout ----------------------------------------------------------------------------

COLUMNS = (
    Column("JOBID"),
    Column("NAME", shrink=8),
    Column("ST", state=True),
    Column("QOS", drop=1),
    Column("REASON"),
)


def test_a_table_that_fits_is_left_alone() -> None:
    assert fit_widths(COLUMNS, [5, 10, 2, 6, 20], 80) == [5, 10, 2, 6, 20]
    assert fit_widths(COLUMNS, [5, 10, 2, 6, 200], None) == [5, 10, 2, 6, 200]


def test_the_last_column_is_cut_first_then_a_column_is_dropped_then_names() -> None:
    assert fit_widths(COLUMNS, [5, 10, 2, 6, 100], 80) == [5, 10, 2, 6, 49]
    widths = fit_widths(COLUMNS, [11, 60, 2, 6, 100], 80)
    assert sum(w for w in widths if w) + 2 * (len([w for w in widths if w]) - 1) <= 80
    assert widths[4] >= render.LAST_COLUMN_FLOOR and widths[1] >= render.SOFT_FLOOR
    narrow = fit_widths(COLUMNS, [11, 60, 2, 6, 100], 40)
    assert narrow[3] == 0  # QOS left out, then the reason and the name cut to their floors
    assert sum(narrow) + 2 * 3 == 40 and narrow[4] == len("REASON")
    assert fit_widths(COLUMNS, [11, 60, 2, 6, 100], 20)[1] == 8  # as narrow as it can be


def test_layout_fits_cuts_with_an_ellipsis_and_colour_keeps_columns() -> None:
    rows = [["40_[3-99%8]", "x" * 50, "PD", "normal", "needs 4 GPUs on one node " * 4]]
    plain = layout(COLUMNS, rows, 80, states=["pending"])
    coloured = layout(COLUMNS, rows, 80, states=["pending"], colour=True)
    assert all(len(line) <= 80 for line in plain)
    assert "…" in plain[1]
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in coloured] == plain
    assert "\x1b[33mPD\x1b[0m" in coloured[1]
    assert layout(COLUMNS, rows, 80, header=False) == plain[1:]


def test_layout_escapes_cells() -> None:
    [_, line] = layout(COLUMNS, [["1", "a\nb", "R", "q", "\x1b[31m"]], None)
    assert "\n" not in line and "\x1b" not in line


# ---- colour ----------------------------------------------------------------------------------


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert render.wants_colour("auto", Tty(), {})
    assert not render.wants_colour("auto", io.StringIO(), {})
    assert not render.wants_colour("auto", Tty(), {"NO_COLOR": "1"})
    assert render.wants_colour("auto", Tty(), {"NO_COLOR": ""})  # no-color.org: empty is unset
    assert not render.wants_colour("auto", Tty(), {"TERM": "dumb"})
    assert render.wants_colour("always", io.StringIO(), {"NO_COLOR": "1"})
    assert not render.wants_colour("never", Tty(), {})


def test_width_from_columns_or_the_terminal_else_none() -> None:
    assert render.output_width(io.StringIO(), {"COLUMNS": "80"}) == 80
    assert render.output_width(io.StringIO(), {}) is None
    assert render.output_width(io.StringIO(), {"COLUMNS": "x"}) is None


# ---- name patterns: memory and PostgreSQL read them as fnmatch does ---------------------------

NAMES = ["sweep-1", "sweep-12", "a.b", "a+b", "x^y", "]s", "a-b", ""]
PATTERNS = ["sweep*", "sweep-?", "a.b", "a[.+]b", "[!a]*", "[^x]*", "[]]s", "*", "[a-c]-b", "a[b"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_match_as_fnmatch(pattern: str) -> None:
    compiled = compile_patterns((pattern,))
    assert compiled is not None
    for name in NAMES:
        assert bool(compiled.fullmatch(name)) == fnmatch.fnmatchcase(name, pattern), name


def test_posix_regex_is_anchored_and_escaped() -> None:
    assert to_posix_regex("a.b*") == r"^a\.b.*$"
    assert to_posix_regex("[!]x]?") == r"^[^\]x].$"


# ---- the server's checks of a listing ---------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        queue_pb2.ListJobsRequest(users=["x"] * 101),
        queue_pb2.ListJobsRequest(users=["a\x1b[31m"]),
        queue_pb2.ListJobsRequest(users=[""]),
        queue_pb2.ListJobsRequest(names=["n" * 129]),
        queue_pb2.ListJobsRequest(names=["[z-a]"]),
        queue_pb2.ListJobsRequest(nodes=["a\nb"]),
        queue_pb2.ListJobsRequest(since=float("nan")),
        queue_pb2.ListJobsRequest(until=-1.0),
        queue_pb2.ListJobsRequest(states=["R"] * 65),
    ],
)
def test_bad_filters_are_one_invalid_input(request_: queue_pb2.ListJobsRequest) -> None:
    with pytest.raises(InvalidInput):
        list_filters(request_)


def test_user_and_users_together_mean_any_of_them() -> None:
    found = list_filters(queue_pb2.ListJobsRequest(user="a", users=["b"]))
    assert found.users == ("a", "b")
    assert list_filters(queue_pb2.ListJobsRequest(user="a")).users is None


def test_hidden_names_match_only_the_callers_jobs() -> None:
    found = list_filters(queue_pb2.ListJobsRequest(names=["secret*"]))
    assert found.hiding_names("alice").users == ("alice",)
    others = list_filters(queue_pb2.ListJobsRequest(names=["s*"], users=["bob"]))
    assert others.hiding_names("alice").users == ()


# ---- --since / --until ------------------------------------------------------------------------

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "ago"),
    [("-2d", 2 * 86400), ("1h ago", 3600), ("30m", 1800), ("2 weeks ago", 14 * 86400), ("now", 0)],
)
def test_relative_times(text: str, ago: float) -> None:
    assert parse_since(text, NOW) == NOW - ago


def test_dates_and_named_days() -> None:
    import datetime as dt

    today = dt.datetime.combine(dt.datetime.fromtimestamp(NOW).date(), dt.time()).timestamp()
    assert parse_since("today", NOW) == today
    assert abs(parse_since("yesterday", NOW) - (today - 86400)) <= 3600  # a DST change
    assert parse_since("2026-11-01", NOW) == dt.datetime(2026, 11, 1).timestamp()


@pytest.mark.parametrize("bad", ["soon", "3 parsecs ago", "1969-12-31", "x" * 1000])
def test_bad_times_say_which_flag(bad: str) -> None:
    with pytest.raises(InvalidInput, match="--until"):
        parse_since(bad, NOW, "--until")
