"""Cron syntax as users know it (0 and 7 are Sunday), on top of APScheduler's CronTrigger."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuq.coordinator.cron_service import next_fire, trigger, weekday_names
from gpuq.errors import InvalidInput


@pytest.mark.parametrize(
    ("field", "names"),
    [
        ("0", "sun"),
        ("7", "sun"),
        ("1-5", "mon,tue,wed,thu,fri"),
        ("*/2", "sun,tue,thu,sat"),
        ("0,6", "sun,sat"),
        ("mon-fri", "mon-fri"),
    ],
)
def test_weekday_numbers_mean_what_cron_means(field: str, names: str) -> None:
    assert weekday_names(field) == names


def test_next_fire_follows_the_schedule() -> None:
    start = dt.datetime(2026, 11, 29, 10, 30).timestamp()  # a Sunday, local time
    assert next_fire("0 3 * * *", start) == dt.datetime(2026, 11, 30, 3, 0).timestamp()
    assert next_fire("*/15 * * * *", start) == dt.datetime(2026, 11, 29, 10, 45).timestamp()
    monday = dt.datetime(2026, 11, 30, 9, 0).timestamp()
    assert next_fire("0 9 * * 1", start) == monday
    assert next_fire("0 9 * * 0", start) == dt.datetime(2026, 12, 6, 9, 0).timestamp()


@pytest.mark.parametrize(
    "schedule",
    ["* * *", "61 * * * *", "* * * * 9", "x * * * *", "1," * 100 + "1 * * * *", "0 3 * * *\x1b"],
)
def test_bad_schedules_are_refused(schedule: str) -> None:
    with pytest.raises(InvalidInput, match="schedule"):
        trigger(schedule)
