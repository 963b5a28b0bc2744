"""Progress read from a job's own output (gpuq.domain.progress): the formats real training
scripts print, as they land in an output file (tqdm's `\\r` rewrites included)."""

from __future__ import annotations

import pytest

from gpuq.domain.progress import (
    STALL_AFTER,
    WINDOW,
    Progress,
    ThroughputTrack,
    latest_progress,
)

TQDM_FILE = (
    "loading data\n"
    "  0%|          | 0/1000 [00:00<?, ?it/s]\r"
    "  1%|          | 10/1000 [00:03<05:10,  3.19it/s]\r"
    " 12%|#2        | 123/1000 [00:38<04:33,  3.21it/s, loss=0.412]"
)
HF_TRAINER = (
    "***** Running training *****\n"
    "  Num examples = 12,000\n"
    "  Num Epochs = 3\n"
    "  Total optimization steps = 1,125\n"
    "  3%|▎         | 30/1125 [00:10<06:05,  3.00it/s]\r"
    "{'loss': 2.1034, 'grad_norm': 1.93, 'learning_rate': 4.9e-05, 'epoch': 0.08}\n"
    "  4%|▍         | 45/1125 [00:15<05:59,  3.01it/s]"
)
LIGHTNING_TQDM = (
    "Epoch 3:  45%|████▌     | 45/100 [00:12<00:15,  3.66it/s, v_num=0, train_loss=0.123]"
)
LIGHTNING_RICH = "Epoch 3/9  ━━━━━━━━━━━━━━━━━━━━ 45/100 0:00:12 • 0:00:15 3.66it/s v_num: 0"


def test_tqdm_bar_newest_rewrite_wins() -> None:
    found = latest_progress(TQDM_FILE)
    assert found == Progress(123, 1000, 3.21, "it", "tqdm")
    assert found.fraction == pytest.approx(0.123)
    assert found.eta() == pytest.approx((1000 - 123) / 3.21)


@pytest.mark.parametrize(
    ("line", "done", "total", "rate", "unit"),
    [
        ("123it [00:10, 12.30it/s]", 123, None, 12.3, "it"),
        ("100%|##########| 50/50 [01:15<00:00,  1.50s/it]", 50, 50, 1 / 1.5, "it"),
        ("eval: 40%|####      | 4.00k/10.0k [00:02<00:03, 1.99kit/s]", 4000, 10000, 1990, "it"),
        ("tokens: 7%| | 700/10000 [00:07<01:33, 99.9 samples/s]", 700, 10000, 99.9, "samples"),
        ("  2%|2         | 2/100 [00:30<24:30, 15.00s/batch]", 2, 100, 1 / 15, "batch"),
    ],
)
def test_tqdm_variants(line: str, done: float, total: float | None, rate: float, unit: str) -> None:
    found = latest_progress(line)
    assert found is not None
    assert (found.done, found.total, found.unit) == (done, total, unit)
    assert found.rate == pytest.approx(rate)


def test_tqdm_before_any_rate_has_no_rate() -> None:
    found = latest_progress("  0%|          | 0/1000 [00:00<?, ?it/s]")
    assert found == Progress(0, 1000, None, "it", "tqdm")
    assert found.eta() is None


def test_hugging_face_trainer_bar_and_log_lines() -> None:
    assert latest_progress(HF_TRAINER) == Progress(45, 1125, 3.01, "it", "tqdm")
    # without a bar (disable_tqdm): the log dictionaries' epoch, out of `Num Epochs`
    logs = "\n".join(line for line in HF_TRAINER.splitlines() if "|" not in line)
    assert latest_progress(logs) == Progress(0.08, 3.0, None, "epoch", "hf-trainer")


def test_lightning_bars() -> None:
    assert latest_progress(LIGHTNING_TQDM) == Progress(45, 100, 3.66, "it", "lightning", "epoch 3")
    # the rich bar names the last epoch: progress is over the whole run (10 epochs of 100)
    assert latest_progress(LIGHTNING_RICH) == Progress(345, 1000, 3.66, "it", "lightning")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("GPUQ_PROGRESS 123/1000", Progress(123, 1000, None, "step", "gpuq")),
        ("GPUQ_PROGRESS 5/20 epochs", Progress(5, 20, None, "epochs", "gpuq")),
        ("GPUQ_PROGRESS 0.42", Progress(0.42, 1.0, None, "", "gpuq")),
        ("GPUQ_PROGRESS 42%", Progress(0.42, 1.0, None, "", "gpuq")),
    ],
)
def test_own_progress_line(line: str, expected: Progress) -> None:
    assert latest_progress(f"starting\n{line}\n") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "GPUQ_PROGRESS 1.5",  # a fraction over 1
        "GPUQ_PROGRESS 3/0",  # no total
        "GPUQ_PROGRESS -1/10",
        "GPUQ_PROGRESS 1e400/1e401",
        "GPUQ_PROGRESS lots",
        "epoch 3 done, loss 0.4 [ok]",
        "x" * 100_000,
        "9" * 5000 + "/1 [00:01, 1it/s]",
        "\x00\x1b[2K\r\r\n\n",
    ],
)
def test_not_progress_is_none(text: str) -> None:
    found = latest_progress(text)
    assert found is None or found.done < 1e18


def test_throughput_from_own_rate_and_eta() -> None:
    track = ThroughputTrack()
    for n, at in enumerate((0.0, 30.0, 60.0)):
        track.add(1000 + at, Progress(100 + 96 * n, 1000, 3.2, "it", "tqdm"))
    now = track.now()
    assert now is not None and now.rate == 3.2 and now.fell_from is None
    assert now.eta == pytest.approx((1000 - 292) / 3.2)


def test_throughput_derived_from_counts_when_not_printed() -> None:
    """GPUQ_PROGRESS lines every 5 minutes, read every 30 s: the rate is per the 5 minutes."""
    track = ThroughputTrack()
    at = 0.0
    for step in (100, 200, 300):
        for _ in range(10):
            track.add(at, Progress(step, 1000, None, "step", "gpuq"))
            at += 30
    now = track.now()
    assert now is not None and now.rate == pytest.approx(100 / 300)


def test_collapse_is_flagged_with_when() -> None:
    track = ThroughputTrack()
    rates = [3.2, 3.1, 3.3, 3.2, 0.1, 0.1]
    done = 0.0
    for n, rate in enumerate(rates):
        done += rate * 30
        track.add(60.0 * n, Progress(done, 10000, rate, "it", "tqdm"))
    now = track.now()
    assert now is not None and now.fell_at == 240.0
    assert now.collapse_line("14:02") == "throughput fell from 3.2 to 0.1 it/s at 14:02"


def test_a_collapse_stays_while_slow_readings_fill_the_window_and_goes_on_recovery() -> None:
    """Readings every 5 s: a job slow for longer than the window holds is still flagged, with
    the rate it fell from and when; back at speed, it is not."""
    track = ThroughputTrack()
    at, done = 0.0, 0.0

    def read(rate: float, times: int) -> None:
        nonlocal at, done
        for _ in range(times):
            at += 5.0
            done += rate * 5
            track.add(at, Progress(done, 1e6, rate, "it", "tqdm"))

    read(3.2, 10)
    read(0.1, 3 * WINDOW)
    now = track.now()
    assert now is not None and (now.fell_from, now.fell_at, now.rate) == (3.2, 55.0, 0.1)
    read(3.0, 1)
    now = track.now()
    assert now is not None and now.fell_from is None and now.rate == 3.0


def test_a_frozen_bar_is_a_stall_not_its_last_rate() -> None:
    track = ThroughputTrack()
    for n in range(4):
        track.add(60.0 * n, Progress(100.0 * n, 10000, 3.2, "it", "tqdm"))
    frozen = Progress(300.0, 10000, 3.2, "it", "tqdm")
    track.add(300.0, frozen)
    assert track.now().rate == 3.2  # not yet a stall  # type: ignore[union-attr]
    track.add(180.0 + STALL_AFTER, frozen)
    now = track.now()
    assert now is not None and now.rate == 0.0 and now.stalled_since == 180.0
    assert now.collapse_line("14:02").startswith("no progress since 14:02")


def test_readings_are_bounded_and_ordered() -> None:
    track = ThroughputTrack()
    for n in range(1000):
        track.add(float(n), Progress(float(n), 1e6, 1.0, "it", "tqdm"))
    track.add(5.0, Progress(1.0, 1e6, 1.0, "it", "tqdm"))  # older than the newest: ignored
    assert len(track.readings) <= 32 and track.readings[-1].at == 999.0
