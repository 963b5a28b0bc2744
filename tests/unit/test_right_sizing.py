"""Right-sizing rules (gpuq.domain.right_sizing) on plain data, and the estimated start of a
job without --time from its user's measured run times (the pure plan)."""

from __future__ import annotations

from dataclasses import replace

from scheduling import POLICY, views, wait
from scheduling import run as running

from gpuq.domain.model import UnitTelemetry, UsageRow
from gpuq.domain.right_sizing import (
    GIB,
    Offer,
    PastRun,
    advise,
    idle_holders,
    measured_run,
    mem_with_headroom,
    quantile,
    run_time_table,
    time_with_headroom,
    verdicts,
)
from gpuq.domain.states import JobState
from gpuq.scheduler.plan import plan

H200_MIG = Offer(mig=(("1g.18gb", 18 * GIB), ("3g.71gb", 71 * GIB), ("7g.141gb", 141 * GIB)))


def past(
    name: str = "train",
    peak_gib: float | None = 10.0,
    asked_gib: int | None = 40,
    elapsed: float = 1800.0,
    limit: float | None = 86400.0,
    state: JobState = JobState.COMPLETED,
    user: str = "alice",
    util_p95: float | None = 90.0,
    gpus: int = 1,
    **extra: object,
) -> PastRun:
    return PastRun(
        user=user,
        name=name,
        state=state,
        gpus=gpus,
        nodes=1,
        asked_gpu_mem=None if asked_gib is None else asked_gib * GIB,
        mig=None,
        gpu_share=None,
        time_limit=limit,
        elapsed=elapsed,
        peak_unit_mem=None if peak_gib is None else int(peak_gib * GIB),
        card_mem=80 * GIB,
        util_mean=util_p95,
        util_p95=util_p95,
        **extra,  # type: ignore[arg-type]
    )


def test_figures_round_up_with_headroom() -> None:
    assert quantile([5, 1, 3, 2, 4], 0.95) == 5 and quantile([], 0.5) is None
    assert quantile(range(1, 21), 0.9) == 18  # nearest rank: a value that occurred
    assert mem_with_headroom(10 * GIB) == 12 * GIB  # 10 x 1.2
    assert mem_with_headroom(int(10.2 * GIB)) == 13 * GIB  # 12.24 -> 13
    assert mem_with_headroom(1) == GIB
    assert time_with_headroom(1800) == 2400  # 37.5 min -> 40 min (5-minute steps)
    assert time_with_headroom(10) == 300
    assert time_with_headroom(3 * 3600) == 3 * 3600 + 2700  # 3h45: 15-minute steps past 2 h


def test_jobs_that_peaked_at_a_quarter_of_their_request_get_a_smaller_gpu_mem() -> None:
    runs = [past(peak_gib=p) for p in (10.0, 9.0, 8.5, 10.2)]
    [advice] = advise(runs, Offer())
    assert (advice.user, advice.name, advice.jobs, advice.measured) == ("alice", "train", 4, 4)
    assert advice.peak_gpu_mem == int(10.2 * GIB) and advice.asked_gpu_mem == 40 * GIB
    assert advice.gpu_mem == 13 * GIB
    # 30 minutes of a day: a --time with headroom, SLURM's form
    assert advice.run_p95 == 1800 and advice.time == 2400
    assert advice.suggestions == ["--gpu-mem 13G", "--time 00:40:00"]
    assert advice.mig is None and advice.gpu_share is None  # the cluster offers neither


def test_nothing_is_suggested_where_the_request_fit() -> None:
    snug = [past(peak_gib=36.0, elapsed=70000.0) for _ in range(3)]  # 43 G needed of 40 asked
    assert advise(snug, Offer()) == []
    # one run not measured: it may have been the biggest, so no memory advice (time stays)
    runs = [past(peak_gib=10.0), past(peak_gib=None)]
    [advice] = advise(runs, Offer())
    assert advice.gpu_mem is None and advice.time == 2400
    # a run that reached its limit: no shorter --time
    runs = [past(elapsed=1800.0), past(elapsed=86400.0, state=JobState.TIMEOUT)]
    [advice] = advise(runs, Offer())
    assert advice.time is None and advice.timeouts == 1 and advice.gpu_mem == 12 * GIB


def test_groups_are_per_user_and_name_and_the_latest_request_counts() -> None:
    runs = [
        past(name="eval", asked_gib=None, peak_gib=60.0, elapsed=80000.0),  # nothing to say
        past(asked_gib=14),  # the latest of "train": 12 G needed of 14 asked is not material
        past(asked_gib=40),
        past(user="bob", asked_gib=80, peak_gib=70.0, elapsed=80000.0),  # fits its request
        past(state=JobState.RUNNING),  # live: not a past run
    ]
    [advice] = advise(runs, Offer())
    assert (advice.name, advice.asked_gpu_mem, advice.gpu_mem) == ("train", 14 * GIB, None)
    assert advice.jobs == 2 and advice.time == 2400


def test_a_mig_profile_is_named_when_memory_and_compute_fit() -> None:
    # 10 GiB peak (12 with headroom), 12 % busy at p95: the 1g.18gb slice (1/7 of the GPU)
    light = [past(asked_gib=None, util_p95=12.0, elapsed=80000.0) for _ in range(2)]
    [advice] = advise(light, H200_MIG)
    assert advice.mig == "1g.18gb" and advice.gpu_mem is None
    assert advice.suggestions == ["--mig 1g.18gb"]
    # 40 % busy: one slice has too little compute; 3g.71gb has 3/7 (43 %)
    [advice] = advise([replace(r, util_p95=40.0) for r in light], H200_MIG)
    assert advice.mig == "3g.71gb"
    # compute unknown, or more GPUs than one: no slice
    assert advise([replace(r, util_p95=None) for r in light], H200_MIG) == []
    assert advise([replace(r, gpus=2) for r in light], H200_MIG) == []


def test_an_mps_share_is_suggested_where_shared_gpus_exist() -> None:
    light = [past(asked_gib=None, util_p95=20.0, elapsed=80000.0)]
    [advice] = advise(light, Offer(shares=True))
    assert (advice.gpu_share, advice.gpu_mem) == (30, 12 * GIB)  # 20 % + a quarter, by 10
    assert advice.suggestions == ["--gpu-share 30 --gpu-mem 12G"]
    assert advise([replace(r, util_p95=70.0) for r in light], Offer(shares=True)) == []


def test_users_whose_gpus_sat_idle_are_named() -> None:
    rows = [
        UsageRow("alice", 3, 7200.0, None, 4.0, util_gpu_seconds=7200.0),  # idle
        UsageRow("bob", 3, 7200.0, None, 60.0, util_gpu_seconds=7200.0),  # busy
        UsageRow("carol", 1, 600.0, None, 1.0, util_gpu_seconds=600.0),  # under a GPU-hour
        UsageRow("dave", 1, 9000.0, None, None, util_gpu_seconds=0.0),  # never measured
        UsageRow("erin", 9, 36000.0, None, 9.0, util_gpu_seconds=36000.0),  # idle, held more
    ]
    assert [(h.user, h.util_mean) for h in idle_holders(rows)] == [("erin", 9.0), ("alice", 4.0)]


def test_eff_verdicts_name_each_badly_sized_resource() -> None:
    run = past(peak_gib=10.2, util_p95=5.0)
    assert verdicts(run, Offer()) == [
        "Time: ran 00:30:00 of 1-00:00:00 (2%): --time 00:40:00 would fit",
        "GPU memory: peak 10.2 GiB of 40 GiB asked (25%): --gpu-mem 13G would fit",
        "GPU utilisation: mean 5%, p95 5%: its GPUs sat mostly idle (is the work on the GPU,"
        " or waiting for data?)",
    ]
    well = past(peak_gib=36.0, elapsed=80000.0)
    assert verdicts(well, Offer()) == []
    assert verdicts(past(peak_gib=None, elapsed=80000.0, util_p95=None), Offer()) == []
    # a running job: figures so far, no time verdict
    live = replace(run, state=JobState.RUNNING)
    assert [v.split(":")[0] for v in verdicts(live, Offer())] == ["GPU memory", "GPU utilisation"]
    assert "so far" in verdicts(live, Offer())[0]
    # no --gpu-mem: against the card, naming a slice the cluster offers
    card = past(asked_gib=None, peak_gib=2.0, util_p95=10.0, elapsed=80000.0)
    assert verdicts(card, H200_MIG) == [
        "GPU memory: peak 2 GiB of its 80 GiB GPU (2%): a MIG slice (--mig 1g.18gb) would do"
    ]
    timed_out = past(state=JobState.TIMEOUT, elapsed=86400.0, peak_gib=36.0)
    assert verdicts(timed_out, Offer())[0].startswith("Time: reached its limit of 1-00:00:00")


def test_eff_does_not_judge_a_run_of_seconds_by_its_card_or_utilisation() -> None:
    """A job of a few seconds spends most of them starting: idle GPUs and an empty card say
    nothing yet; a peak far under its own --gpu-mem still does."""
    short = past(asked_gib=None, peak_gib=0.0, util_p95=0.0, elapsed=4.0, state=JobState.FAILED)
    assert verdicts(short, H200_MIG) == []
    asked = past(peak_gib=10.0, util_p95=0.0, elapsed=4.0, state=JobState.FAILED)
    assert verdicts(asked, Offer()) == [
        "GPU memory: peak 10 GiB of 40 GiB asked (25%): --gpu-mem 12G would fit"
    ]


def test_eff_names_gpus_a_job_never_used() -> None:
    units = (
        UnitTelemetry("GPU-0", peak_mem=30 * GIB, util_mean=90.0),
        UnitTelemetry("GPU-1", peak_mem=0, util_mean=0.0),
        UnitTelemetry("GPU-2", peak_mem=0, util_mean=0.0),
        UnitTelemetry("GPU-3", peak_mem=30 * GIB, util_mean=85.0),
    )
    run = past(gpus=4, peak_gib=30.0, elapsed=80000.0, units=units)
    assert verdicts(run, Offer()) == ["GPUs: 2 of 4 never used: --gpus 2 would do"]


def test_measured_run_times_are_the_p90_bounded_by_the_limit() -> None:
    rows = [("alice", "train", float(s)) for s in range(100, 0, -1)]  # newest first
    rows += [("alice", "eval", 50.0), ("bob", "train", 7.0)]
    table = run_time_table(rows)
    # the latest 20 (100 down to 81): their p90
    assert table == {("alice", "train"): 98.0, ("alice", "eval"): 50.0, ("bob", "train"): 7.0}
    assert measured_run([600.0, 700.0], 300.0) == 300.0  # never over the enforced limit
    assert measured_run([], 300.0) is None


def test_the_estimated_start_uses_measured_run_times_where_a_job_has_no_time() -> None:
    # one GPU, held by a job without --time (the QOS default: a day) that usually runs 10 min
    day = POLICY.tiers["normal"].default_time
    assert day == 86400
    live = [replace(running(1, "a", [0], start=0.0, limit=day), name="train", user="alice")]
    nodes = views({"a": 1}, live)
    queue = [wait(10, limit=day, user="alice", name="train")]
    by_limits = plan(nodes, live, queue, POLICY, 60.0, explain=True)
    assert by_limits.waiting[10].estimated_start == day
    # measured: the running one ends at 600 s; the next one after it, for its 600 s
    measured = [replace(live[0], expected_end=600.0)]
    queue = [
        wait(10, limit=day, user="alice", name="train", expected_run=600.0),
        wait(11, limit=day, user="alice", name="train", expected_run=600.0, priority=-20),
    ]
    decided = plan(nodes, measured, queue, POLICY, 60.0, explain=True)
    assert decided.waiting[10].estimated_start == 600.0
    assert decided.waiting[11].estimated_start == 1200.0
    # a job behind them with no measurement waits for their measured runs, not a day each
    queue.append(wait(12, limit=day, priority=-30))
    decided = plan(nodes, measured, queue, POLICY, 60.0, explain=True)
    assert decided.waiting[12].estimated_start == 1800.0
    # only the estimate moves: nothing starts, and backfill keeps to the limits
    assert decided.starts == ()
