"""Prometheus metrics of one coordinator ([coordinator] metrics_listen, README "Metrics").

Two kinds, so that a scrape costs little and nothing is counted twice:

- Events (counters, histograms) are counted as they happen: Metrics listens on the event bus
  (gpuq.coordinator.changes.event_bus) to every job event (submissions, starts, ends, and the
  queue wait and run time they close), to every scheduling pass's duration, and to every
  group commit's.
- State (jobs by state, pending reasons, nodes, GPUs, fair share) is read at scrape time
  from the coordinator's memory by `StateCollector`. The scrape runs on the event loop (the
  HTTP server is asyncio), so memory is read between two of its changes, without locks; it
  reads counts memory keeps as jobs change (LiveJobs.tally) and reason counts made once per
  explanation of the queue, so a scrape's cost does not grow with 200,000 queued jobs
  (running jobs, bounded by the GPUs, are still walked).

Each coordinator has its own CollectorRegistry, never prometheus_client's global one: one
process may run several (tests do), and the global one would mix them. Names follow
Prometheus conventions (a `gpuq_` prefix, base units, `_total` counters). Labels are bounded
sets (states, QOS tiers, reason categories, node and user names, GPUs): never a job id, a job
name or free text, so the number of series does not grow with the number of jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.access.permissions import sees
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeEntry, NodeTable
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.notifications import Notifier
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.coordinator.workload.idle_rules import IdleWatch
from gpuq.domain.model import GpuUnit, Health, Job, JobEvent, NodeState
from gpuq.domain.states import JobState
from gpuq.scheduler.snapshot import Waiting
from gpuq.scheduler.waiting_reasons import NEVER_ON_UP
from gpuq.web.http_types import Request, Response

# seconds: a batch queue's waits and runs go from seconds to days
LONG_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    28800.0,
    86400.0,
    172800.0,
    604800.0,
)
# seconds: a scheduling pass or a commit takes milliseconds; a slow one stands out
SHORT_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
LIVE_STATES = (JobState.PENDING, JobState.HELD, JobState.RUNNING)
# the main reason a pending job waits, as a bounded category (the reasons themselves are free
# text: `gpuq show` prints them)
REASONS = (
    "resources",  # no node has room now (or room is reserved for a job ahead)
    "priority",  # jobs of higher priority wait ahead of it
    "dependency",
    "dependency_never_met",
    "begin_time",
    "qos_limit",
    "array_limit",
    "singleton",
    "placement",  # its nodelist, exclude or constraint leaves no node
    "nodes_unavailable",  # the nodes that could run it are down, drained or unreachable
    "unknown",  # not explained yet (an array's tasks not split off, a job just queued)
)
NODE_STATES = ("up", "drained", "disconnected", "down")
# what a reason starts with -> its category (the texts come from gpuq.scheduler)
_PREFIXES = (
    ("dependency can never be met", "dependency_never_met"),
    ("dependency:", "dependency"),
    ("begin time", "begin_time"),
    ("array limit:", "array_limit"),
    ("singleton:", "singleton"),
    ("priority:", "priority"),
    ("nodelist:", "placement"),
    ("exclude:", "placement"),
    ("constraint:", "placement"),
    (NEVER_ON_UP, "nodes_unavailable"),
    ("no node is up", "nodes_unavailable"),
    ("node ", "nodes_unavailable"),  # "node b is down; node c has no agent connected"
)


def reason_category(reason: str) -> str:
    """One scheduler reason's category (see REASONS); a shortage or reservation is
    "resources". A reason said of a job's partitions ("partition gpu: ...") counts as what
    it says after that."""
    if reason.startswith("partition "):
        reason = reason.partition(": ")[2]
        if reason == "no node is in it":
            return "placement"
    if reason.startswith("qos ") and " limit:" in reason:
        return "qos_limit"
    for prefix, category in _PREFIXES:
        if reason.startswith(prefix):
            return category
    return "resources"


def main_reason(waiting: Waiting | None) -> str:
    """The category a pending job is counted under: its first reason, except that a job that
    waits for resources behind jobs of higher priority waits for "priority" (SLURM's
    Resources is the job at the head of the queue, Priority the ones behind it)."""
    if waiting is None or not waiting.reasons:
        return "unknown"
    categories = [reason_category(r) for r in waiting.reasons]
    if "priority" in categories and all(c in ("resources", "priority") for c in categories):
        return "priority"
    return categories[0]


def gpu_label(unit: GpuUnit) -> str:
    """A whole GPU's index ("0"), or a MIG slice's "0/3g.40gb"; the uuid label tells two
    slices of one profile apart."""
    return f"{unit.index}/{unit.mig_profile or '?'}" if unit.is_mig else str(unit.index)


def node_state(entry: NodeEntry, admin_drained: bool) -> str:
    """One of NODE_STATES: down (past its heartbeat timeout), disconnected (up in the store,
    no agent stream now), drained (by an admin or its agent), up."""
    if entry.node.state is not NodeState.UP:
        return "down"
    if not entry.connected:
        return "disconnected"
    if admin_drained or entry.drained:
        return "drained"
    return "up"


@dataclass(frozen=True, slots=True)
class MetricSources:
    """The parts of the coordinator a scrape reads (memory only, on the event loop)."""

    settings: CoordinatorSettings
    jobs: LiveJobs
    nodes: NodeTable
    inputs: SchedulerInputs
    arrays: ArrayTasks
    idle: IdleWatch
    notifier: Notifier
    clock: Callable[[], float]
    explain: Callable[[], Mapping[int, Waiting]] | None = None


class Metrics:
    """The instruments of one coordinator; assemble() subscribes them to the event bus."""

    def __init__(self, sources: MetricSources) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.submitted = PromCounter(
            "gpuq_jobs_submitted",
            "Jobs submitted (each task of an array counts as one job).",
            registry=registry,
        )
        self.started = PromCounter(
            "gpuq_jobs_started",
            "Job starts: pending jobs the scheduler started on a node (a requeued job that "
            "starts again counts again).",
            registry=registry,
        )
        self.ended = PromCounter(
            "gpuq_jobs_ended",
            "Jobs that reached an end state, by that state (a preempted or node_fail job that "
            "is requeued counts too, and again when it ends for good).",
            ["state"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "gpuq_job_queue_wait_seconds",
            "Seconds a job waited in the queue before it started: from when it was queued "
            "(submitted, released or requeued) or its begin time, whichever is later.",
            buckets=LONG_BUCKETS,
            registry=registry,
        )
        self.run_time = Histogram(
            "gpuq_job_run_seconds",
            "Seconds a job ran, from its start to its end, by the state it ended in.",
            ["state"],
            buckets=LONG_BUCKETS,
            registry=registry,
        )
        self.pass_time = Histogram(
            "gpuq_scheduling_pass_seconds",
            "Seconds one scheduling pass took: plan, store transaction and telling agents.",
            buckets=SHORT_BUCKETS,
            registry=registry,
        )
        self.write_time = Histogram(
            "gpuq_store_write_seconds",
            "Seconds one store commit took, as the coordinator waited for it (a group commit: "
            "the writes that queued meanwhile share one transaction).",
            buckets=SHORT_BUCKETS,
            registry=registry,
        )
        for state in JobState:  # every ending shows, at 0 until it happens
            if not state.is_live:
                self.ended.labels(state.value)
        # when each pending job was queued (submitted, released, requeued) in this process;
        # a job loaded at start counts from its submit time
        self._queued_at: dict[int, float] = {}
        registry.register(StateCollector(sources))

    def observe(self, event: JobEvent, job: Job | None) -> None:
        """Count one job event (an event bus listener). `job` is the job as it was before the
        change, or as it is after a start or a submission."""
        before, after = event.from_state, event.to_state
        if before is None:
            if job is not None and job.array_job_id in (None, job.id):  # not a task split off
                self.submitted.inc(len(job.spec.array.indices) if job.spec.array else 1)
                if after is JobState.PENDING:
                    self._queued_at[event.job_id] = event.at
            return
        if before is after:
            return  # an update
        if after is JobState.PENDING:
            self._queued_at[event.job_id] = event.at
        elif after is JobState.RUNNING and before is JobState.PENDING:
            self.started.inc()
            queued = self._queued_at.pop(event.job_id, None)
            if job is not None:
                since = max(
                    queued if queued is not None else job.submit_time,
                    job.spec.begin_time or 0.0,
                )
                self.queue_wait.observe(max(0.0, event.at - since))
        elif not after.is_live:
            self._queued_at.pop(event.job_id, None)
            self.ended.labels(after.value).inc()
            if before is JobState.RUNNING and job is not None and job.start_time is not None:
                self.run_time.labels(after.value).observe(max(0.0, event.at - job.start_time))
        elif after is JobState.HELD:
            self._queued_at.pop(event.job_id, None)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)

    async def handle(self, request: Request) -> Response:
        """GET (or HEAD) /metrics; nothing else is served on this port."""
        if request.path != "/metrics":
            return Response(404, b"not found: metrics are at /metrics\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=[("allow", "GET, HEAD")])
        # the format the scraper asks for (OpenMetrics, or the text format's version), as
        # prometheus_client's own handlers choose it; without an Accept header, text 0.0.4
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(200, encode(self.registry), content_type)


class StateCollector:
    """What the coordinator's memory says now, read at each scrape."""

    def __init__(self, sources: MetricSources) -> None:
        self.co = sources
        self.explain = sources.explain
        self._explained: Mapping[int, Waiting] | None = None  # the explanation last counted
        self._counted: Counter[str] = Counter()

    def describe(self) -> Iterable[Metric]:
        return []  # names are not reserved: the families vary with the cluster

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._nodes()
        yield from self._users()
        yield self._notifications()

    def _jobs(self) -> Iterator[Metric]:
        """Counts kept as jobs change (LiveJobs.tally): no walk over the queue."""
        co = self.co
        by_state: Counter[tuple[str, str]] = Counter()
        for qos in co.settings.qos:  # every configured tier shows, at 0 when empty
            for state in LIVE_STATES:
                by_state[(state.value, qos)] += 0
        for (state, qos), count in co.jobs.tally.items():
            by_state[(state.value, qos)] += count
        jobs = GaugeMetricFamily(
            "gpuq_jobs",
            "Live jobs by state (pending, held, running) and QOS; an array's tasks not yet "
            "split off count one each.",
            labels=["state", "qos"],
        )
        for (state_name, qos), count in sorted(by_state.items()):
            jobs.add_metric([state_name, qos], count)
        yield jobs
        family = GaugeMetricFamily(
            "gpuq_pending_jobs",
            "Pending jobs by the main reason they wait, as a category: resources, priority, "
            "dependency, dependency_never_met, begin_time, qos_limit, array_limit, singleton, "
            "placement, nodes_unavailable, unknown (`gpuq show` gives the full reasons).",
            labels=["reason"],
        )
        pending = sum(n for (state, _), n in by_state.items() if state == "pending")
        for reason, count in self._reasons(pending).items():
            family.add_metric([reason], count)
        yield family

    def _reasons(self, pending: int) -> Counter[str]:
        """Pending jobs by reason category: counted once per explanation of the queue (the
        scheduling pass makes one at most once a second, less often for a long queue), not
        at every scrape; jobs queued since the explanation are "unknown"."""
        reasons: Counter[str] = Counter(dict.fromkeys(REASONS, 0))
        if not pending:
            return reasons
        explained = self.explain() if self.explain is not None else {}
        if explained is not self._explained:
            self._explained, self._counted = explained, self._categories(explained)
        reasons.update(self._counted)
        reasons["unknown"] += max(0, pending - sum(self._counted.values()))
        return reasons

    def _categories(self, explained: Mapping[int, Waiting]) -> Counter[str]:
        counted: Counter[str] = Counter()
        for job in self.co.jobs.in_state(JobState.PENDING):
            waiting = explained.get(job.id)
            if job.tasks and waiting is None:
                sibling = self.co.arrays.first_waiting(job)
                waiting = explained.get(sibling.id) if sibling is not None else None
            counted[main_reason(waiting)] += len(job.tasks) or 1
        return counted

    def _nodes(self) -> Iterator[Metric]:
        co = self.co
        nodes_table = co.nodes
        states: Counter[str] = Counter(dict.fromkeys(NODE_STATES, 0))
        total = _node_gauge("gpuq_node_gpus", "GPU units the node has (whole GPUs and MIG slices).")
        allocated = _node_gauge(
            "gpuq_node_gpus_allocated",
            "GPU units held by running jobs (or by jobs still being stopped) on the node.",
        )
        idle = _node_gauge(
            "gpuq_node_gpus_idle_allocated",
            "GPU units held by running jobs that are flagged idle (their GPUs below their "
            "QOS's idle_threshold for its idle_window).",
        )
        unhealthy = _node_gauge(
            "gpuq_node_gpus_unhealthy",
            "GPU units the node's agent reports unhealthy (NVML errors, lost GPU, XID, ECC).",
        )
        dirty = _node_gauge(
            "gpuq_node_gpus_dirty",
            "GPU units the node's agent reports dirty (processes of an ended job, or foreign "
            "ones, still hold them).",
        )
        drained = _node_gauge(
            "gpuq_node_gpus_drained",
            "GPU units an admin drained (gpuq drain), whole node included.",
        )
        gpu_labels = ["node", "gpu", "uuid", "model"]
        utilization = GaugeMetricFamily(
            "gpuq_gpu_utilization_ratio",
            "How busy the GPU unit is, 0 to 1, as its agent's last heartbeat said (absent when "
            "unknown, e.g. a MIG slice).",
            labels=gpu_labels,
        )
        used = GaugeMetricFamily(
            "gpuq_gpu_memory_used_bytes",
            "Bytes of the GPU unit's memory in use, as its agent's last heartbeat said.",
            labels=gpu_labels,
        )
        capacity = GaugeMetricFamily(
            "gpuq_gpu_memory_total_bytes", "Bytes of memory the GPU unit has.", labels=gpu_labels
        )
        running: dict[str, set[str]] = {}
        idle_units: dict[str, set[str]] = {}
        for job in co.jobs.in_state(JobState.RUNNING):
            track = co.idle.tracks.get(job.id)
            is_idle = track is not None and track.start == job.start_count and "idle" in track.flags
            for node in job.node_names:  # units are UUIDs: each node counts its own
                running.setdefault(node, set()).update(job.gpus)
                if is_idle:
                    idle_units.setdefault(node, set()).update(job.gpus)
        for name, entry in sorted(nodes_table.nodes.items()):
            whole = nodes_table.drains.get((name, ""))
            states[node_state(entry, whole is not None)] += 1
            units = {u.uuid: u for u in entry.node.units}
            held = set(running.get(name, set()))
            for more in entry.held.values():
                held |= more
            agent = entry.agent_health()
            total.add_metric([name], len(units))
            allocated.add_metric([name], len(held & units.keys()))
            idle.add_metric([name], len(idle_units.get(name, set()) & units.keys()))
            unhealthy.add_metric([name], sum(1 for h, _ in agent.values() if h is Health.UNHEALTHY))
            dirty.add_metric([name], sum(1 for h, _ in agent.values() if h is Health.DIRTY))
            drained.add_metric(
                [name],
                len(units)
                if whole is not None
                else sum(1 for u in units if (name, u) in nodes_table.drains),
            )
            for unit in entry.node.units:
                capacity.add_metric(
                    [name, gpu_label(unit), unit.uuid, unit.name], float(unit.memory)
                )
            for usage in entry.usage:
                known = units.get(usage.uuid)
                if known is None:
                    continue
                labels = [name, gpu_label(known), known.uuid, known.name]
                used.add_metric(labels, float(usage.memory_used))
                if usage.HasField("utilization"):
                    utilization.add_metric(labels, usage.utilization / 100.0)
        nodes = GaugeMetricFamily(
            "gpuq_nodes",
            "Known nodes by state: up (taking work), drained (by an admin or its agent), "
            "disconnected (no agent stream now), down (past its heartbeat timeout).",
            labels=["state"],
        )
        for state, count in states.items():
            nodes.add_metric([state], count)
        yield nodes
        yield from (total, allocated, idle, unhealthy, dirty, drained)
        yield from (utilization, used, capacity)

    def _users(self) -> Iterator[Metric]:
        """Per-user families; none where private_data holds "usage" (a scrape signs in as
        nobody: permissions.sees)."""
        co = self.co
        if not sees(None, "", "usage", co.settings.private_data):
            return
        usage = GaugeMetricFamily(
            "gpuq_user_fairshare_usage_gpu_seconds",
            "The user's GPU-seconds with the fair-share half-life's decay applied, as the "
            "scheduler ranks by (users with usage only).",
            labels=["user"],
        )
        for user, value in sorted(co.inputs.current_usage(co.clock()).items()):
            usage.add_metric([user], value)
        yield usage
        factor = GaugeMetricFamily(
            "gpuq_user_fairshare_factor",
            "The user's fair-share factor (0 to 1; higher ranks their jobs higher) as of the "
            "last recalculation.",
            labels=["user"],
        )
        for user, value in sorted(co.inputs.shares.items()):
            factor.add_metric([user], value)
        yield factor
        gpus: Counter[str] = Counter()
        for job in co.jobs.in_state(JobState.RUNNING):
            gpus[job.user] += len(job.gpus)
        running = GaugeMetricFamily(
            "gpuq_user_running_gpus",
            "GPU units the user's running jobs hold (users with running jobs only).",
            labels=["user"],
        )
        for user, count in sorted(gpus.items()):
            running.add_metric([user], count)
        yield running

    def _notifications(self) -> Metric:
        sent = CounterMetricFamily(
            "gpuq_notifications",
            "Mails and webhooks (users' and admins') by outcome: sent, failed (given up after "
            "retries, or refused) or dropped (too many waiting).",
            labels=["kind", "outcome"],
        )
        counts = self.co.notifier.sent
        for kind in ("mail", "webhook"):
            for outcome in ("sent", "failed", "dropped"):
                sent.add_metric([kind, outcome], counts[(kind, outcome)])
        return sent


def _node_gauge(name: str, text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, labels=["node"])
