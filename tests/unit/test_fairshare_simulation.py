"""A simulated day on two 4-GPU nodes, driven by the pure scheduler and a fake clock.

Two users flood the queue equally; fair share must give them GPU time within 10% of each
other. A third user who arrives at noon with a few jobs gets them started ahead of the flood.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from scheduling import POLICY, views

from gpuq.domain.model import Resources
from gpuq.scheduler.plan import plan
from gpuq.scheduler.priority import decayed, rank
from gpuq.scheduler.snapshot import PendingJob, RunningJob

HOUR = 3600.0
JOB_SECONDS = 600.0


@dataclass
class Simulation:
    now: float = 0.0
    queue: list[PendingJob] = field(default_factory=list)
    running: dict[int, RunningJob] = field(default_factory=dict)
    ends: list[tuple[float, int]] = field(default_factory=list)
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)  # user -> (value, at)
    gpu_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    started: dict[int, float] = field(default_factory=dict)
    next_id: int = 1

    def submit(self, user: str, count: int) -> list[int]:
        ids = []
        for _ in range(count):
            self.queue.append(
                PendingJob(
                    self.next_id,
                    user,
                    "normal",
                    Resources(gpus=1),
                    self.now,
                    time_limit=JOB_SECONDS,
                )
            )
            ids.append(self.next_id)
            self.next_id += 1
        return ids

    def decayed_usage(self) -> dict[str, float]:
        half_life = POLICY.settings.fairshare_half_life
        return {u: decayed(v, at, self.now, half_life) for u, (v, at) in self.usage.items()}

    def schedule(self) -> None:
        ordered = rank(self.queue, self.decayed_usage(), POLICY.tiers, POLICY.settings, self.now)
        live = list(self.running.values())
        decided = plan(views({"a": 4, "b": 4}, live), live, ordered, POLICY, self.now)
        by_id = {j.job_id: j for j in self.queue}
        for start in decided.starts:
            job = by_id[start.job_id]
            self.queue.remove(job)
            self.running[job.job_id] = RunningJob(
                job.job_id,
                job.user,
                job.qos,
                start.node,
                start.gpus,
                1,
                0,
                self.now,
                self.now + JOB_SECONDS,
            )
            self.started[job.job_id] = self.now
            heapq.heappush(self.ends, (self.now + JOB_SECONDS, job.job_id))

    def advance(self, until: float) -> None:
        """Run the jobs' ends up to `until`; one scheduling pass per instant with ends."""
        while self.ends and self.ends[0][0] <= until:
            self.now = self.ends[0][0]
            while self.ends and self.ends[0][0] == self.now:
                job = self.running.pop(heapq.heappop(self.ends)[1])
                seconds = len(job.gpus) * (self.now - job.start_time)
                self.gpu_seconds[job.user] += seconds
                value = self.decayed_usage().get(job.user, 0.0)
                self.usage[job.user] = (value + seconds, self.now)
            self.schedule()
        self.now = until


def test_two_flooding_users_share_equally_and_a_newcomer_goes_first() -> None:
    sim = Simulation()
    sim.submit("alice", 1000)
    sim.submit("bob", 1000)
    sim.schedule()
    sim.advance(12 * HOUR + 1)  # between two rounds of job ends
    carol = sim.submit("carol", 5)
    sim.schedule()
    noon = sim.now
    sim.advance(24 * HOUR)

    alice, bob = sim.gpu_seconds["alice"], sim.gpu_seconds["bob"]
    assert alice > 0 and bob > 0
    assert abs(alice - bob) / max(alice, bob) <= 0.10, (alice, bob)
    assert alice + bob + sim.gpu_seconds["carol"] >= 0.95 * 8 * 24 * HOUR  # GPUs kept busy

    carol_last_start = max(sim.started[j] for j in carol)
    flood_started_after_noon = [t for j, t in sim.started.items() if j not in carol and t >= noon]
    assert carol_last_start <= min(flood_started_after_noon), "the flood went before carol"
    assert carol_last_start - noon <= JOB_SECONDS  # within the next round of job ends
