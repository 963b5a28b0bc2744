"""A running job's progress as the CLI shows it (gpuq.cli.progress_text): the PROGRESS column
of `gpuq queue --long`, `gpuq show`'s lines and `progress` in --json; and the wire message the
coordinator builds from a Throughput (gpuq.convert.throughput_to_proto)."""

from __future__ import annotations

import time

from gpuq.cli.progress_text import progress_cell, progress_dict, progress_lines
from gpuq.convert import throughput_to_proto
from gpuq.coordinator.nodes.agent_input import progress_from_proto
from gpuq.domain.progress import Progress, Throughput
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

READ = 1_700_000_000.0


def running(throughput: Throughput, collapse: str = "") -> pb.Job:
    return pb.Job(id=3, state="running", progress=throughput_to_proto(throughput, READ, collapse))


def test_a_tqdm_jobs_progress_shows_its_share_rate_and_eta() -> None:
    job = running(Throughput(Progress(120, 1000, 3.2, "it", "tqdm"), 3.2, 275.0))
    assert progress_cell(job) == "12% 3.2it/s ETA 00:04:35"
    assert progress_dict(job) == {
        "done": 120.0,
        "total": 1000.0,
        "fraction": 0.12,
        "unit": "it",
        "label": None,
        "rate": 3.2,
        "eta": 275.0,
        "source": "tqdm",
        "read_at": READ,
        "collapse": None,
    }
    read = time.strftime("%H:%M:%S", time.localtime(READ))
    at = time.strftime("%H:%M", time.localtime(READ + 275))
    assert progress_lines(job) == [
        ("Progress", f"120/1000 it, 12.0% (tqdm, read {read})"),
        ("Throughput", "3.2it/s"),
        ("ETA", f"00:04:35 (about {at})"),
    ]


def test_what_is_unknown_is_left_out_and_a_collapse_is_said() -> None:
    epoch = Progress(3000, None, None, "samples", "lightning", "epoch 2")
    job = running(Throughput(epoch, 0.1, None, 3.2, READ - 60), "throughput fell ...")
    assert progress_cell(job) == "3000 samples 0.1 samples/s"
    lines = dict(progress_lines(job))
    assert lines["Progress"].startswith("3000 samples, epoch 2 (lightning, read ")
    assert lines["Throughput"] == "0.1 samples/s"  # the collapse is in the flags
    assert "ETA" not in lines
    data = progress_dict(job)
    assert data is not None and data["total"] is None and data["eta"] is None
    assert data["collapse"] == "throughput fell ..." and data["label"] == "epoch 2"


def test_no_progress_shows_as_a_dash_and_null() -> None:
    job = pb.Job(id=3, state="running")
    assert (progress_cell(job), progress_dict(job), progress_lines(job)) == ("-", None, [])


def test_what_an_agent_says_is_checked_before_it_is_kept() -> None:
    good = apb.JobProgress(job_id=1, done=5, total=10, rate=2.0, unit="it", source="tqdm")
    assert progress_from_proto(good) == Progress(5, 10, 2.0, "it", "tqdm")
    for bad in (
        apb.JobProgress(done=float("nan")),
        apb.JobProgress(done=-1),
        apb.JobProgress(done=1, total=0),
        apb.JobProgress(done=1, total=float("inf")),
    ):
        assert progress_from_proto(bad) is None, bad
    odd = apb.JobProgress(done=1, rate=float("nan"), unit="it\x1b[2J" + "x" * 100, label="a\nb")
    kept = progress_from_proto(odd)
    assert kept is not None and kept.rate is None and kept.label == "a b"
    assert "\x1b" not in kept.unit and len(kept.unit) <= 40
