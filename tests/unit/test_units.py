"""Sizes and durations as SLURM users write them, and the one error for each mistake."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.domain.units import format_duration, format_size, parse_duration, parse_size
from gpuq.errors import InvalidInput

GiB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40G", 40 * GiB),
        ("40GiB", 40 * GiB),
        ("40GB", 40 * GiB),
        ("40g", 40 * GiB),
        ("512M", 512 * 1024**2),
        ("1.5T", int(1.5 * 1024**4)),
        ("2048", 2048 * 1024**2),  # a bare number is megabytes, as with sbatch --mem
        ("100K", 100 * 1024),
        ("4096B", 4096),
        (" 8G ", 8 * GiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "40X", "-1G", "0", "0G", "1e3", "40 GG", "0.1B", "abc"])
def test_parse_size_refuses_with_the_field_and_value(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_size(text, "--mem")
    assert info.value.field == "--mem"
    assert info.value.value == text
    assert str(info.value).startswith(f"invalid --mem {text!r}: ")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),
        ("90:00", 90 * 60),
        ("90:30", 90 * 60 + 30),
        ("2:00:00", 7200),
        ("1-00:00:00", 86400),
        ("1-12", 86400 + 12 * 3600),
        ("1-12:30", 86400 + 12 * 3600 + 30 * 60),
        ("0-0:0:5", 5),
        ("100:00:00", 100 * 3600),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "0", "00:00", "1-24", "1:60", "1:00:60", "1-1:60", "abc", "1.5", "-5", "1-"]
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration(text, "--time")
    assert info.value.field == "--time"


@given(st.integers(min_value=1, max_value=400 * 86400))
def test_duration_format_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_size() -> None:
    assert format_size(40 * GiB) == "40G"
    assert format_size(int(1.5 * 1024**4)) == "1.5T"
    assert format_size(512) == "512B"
    assert format_duration(93784) == "1-02:03:04"
    assert format_duration(59) == "00:00:59"
