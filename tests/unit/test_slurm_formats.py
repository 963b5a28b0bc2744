"""SLURM's output forms as gpuq.slurm prints them: squeue's and sinfo's %-fields with widths,
squeue -O and sacct -o field lists, states in SLURM's words, SLURM's time forms."""

from __future__ import annotations

import pytest

from gpuq.slurm.formats import (
    Field,
    FormatError,
    cell,
    exit_code_text,
    parse_names,
    parse_percent,
    parse_states,
    percent_line,
    slurm_duration,
)
from gpuq.slurm.listing_commands import SACCT_WIDTHS, SQUEUE_CODES, SQUEUE_NAMES


def test_percent_fields_with_widths_and_literal_text() -> None:
    parts = parse_percent("%.18i %-9P|%j %%%t", SQUEUE_CODES)
    assert parts == [
        Field("i", 18, right=True),
        " ",
        Field("P", 9),
        "|",
        Field("j"),
        " ",
        "%",
        Field("t"),
    ]
    line = percent_line(parts, {"i": "42", "P": "gpuq", "j": "train", "t": "R"})
    assert line == f"{'42':>18} gpuq     |train %R"


def test_a_width_cuts_and_pads_and_no_width_prints_as_is() -> None:
    assert cell("verylongname", Field("j", 8)) == "verylong"
    assert cell("ab", Field("j", 5, right=True)) == "   ab"
    assert cell("ab", Field("j", 5)) == "ab   "
    assert cell("verylongname", Field("j")) == "verylongname"
    assert cell("verylongname", Field("JobName", 8, right=True), cut_mark="+") == "verylon+"


def test_unknown_percent_code_is_refused() -> None:
    with pytest.raises(FormatError, match="%Z is not supported"):
        parse_percent("%i %Z", SQUEUE_CODES)


def test_squeue_field_names_any_case_with_widths_and_suffix() -> None:
    fields = parse_names("jobid:.8,State,name:12x", SQUEUE_NAMES, width_mark=":", default_width=20)
    assert fields == [
        Field("JobID", 8, right=True),
        Field("State", 20),
        Field("Name", 12, suffix="x"),
    ]


def test_sacct_field_lists_with_widths() -> None:
    fields = parse_names(
        "JobID,jobname%30,State%-12,ExitCode",
        SACCT_WIDTHS,
        width_mark="%",
        default_width=SACCT_WIDTHS,
    )
    assert fields == [
        Field("JobID", 12, right=True),
        Field("JobName", 30, right=True),
        Field("State", 12, right=False),
        Field("ExitCode", 8, right=True),
    ]
    with pytest.raises(FormatError, match="Invalid field requested: Bogus"):
        parse_names("JobID,Bogus", SACCT_WIDTHS, width_mark="%", default_width=SACCT_WIDTHS)
    with pytest.raises(FormatError):
        parse_names(" , ", SACCT_WIDTHS, width_mark="%", default_width=SACCT_WIDTHS)


def test_states_in_slurms_words() -> None:
    assert parse_states(["PD,R"]) == {"pending", "held", "running"}
    assert parse_states(["completed", "OOM", "nf"]) == {"completed", "out_of_memory", "node_fail"}
    assert parse_states(["COMPLETING"]) == frozenset()  # gpuq never has it
    assert "timeout" in parse_states(["all"])
    with pytest.raises(FormatError, match="Invalid job state specified: bogus"):
        parse_states(["R,bogus"])


def test_times_and_exit_codes_as_slurm_prints_them() -> None:
    assert slurm_duration(65) == "00:01:05"
    assert slurm_duration(90061) == "1-01:01:01"
    assert slurm_duration(65, compact=True) == "1:05"
    assert slurm_duration(3725, compact=True) == "1:02:05"
    assert slurm_duration(None, compact=True) == "0:00"
    assert exit_code_text(3, None) == "3:0"
    assert exit_code_text(None, 9) == "0:9"


@pytest.mark.parametrize("text", ["%.99999999999i", "%1001i", "%.5000j"])
def test_a_width_past_1000_is_refused_not_padded(text: str) -> None:
    """`squeue -o "%.99999999999i"` would pad every line to 100 GB."""
    with pytest.raises(FormatError, match="at most 1000"):
        parse_percent(text, {"i": "JOBID", "j": "NAME"})
    with pytest.raises(FormatError, match="at most 1000"):
        parse_names("JobID:.99999999", {"JobID": "JOBID"}, width_mark=":", default_width=None)
