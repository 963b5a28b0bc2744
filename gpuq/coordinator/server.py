"""The coordinator put together: `assemble` makes every part, gives each its collaborators in
its constructor, and wires the reactions between parts in one place, where they can be read
in order. gpuq.coordinator.serving runs an assembled coordinator behind its ports; tests run
one in-process (tests/harness.py).

The parts, by what each owns (docs/ARCHITECTURE.md has the map):
- memory: LiveJobs, NodeTable, SchedulerInputs (what the store last committed, for reads
  without a database round trip), MemoryLoader;
- changes: the StoreWriter (group commit), JobChanges (the one applier of every job change),
  the EventBus and its Watchers;
- workload: Submissions, JobActions (user verbs over a Selection), JobEndings, ArrayTasks,
  JobSamples (idle rules, GPU telemetry, RunningProgress: progress and throughput), GpuHistory
  (each GPU's, for the dashboard);
- scheduling: SchedulingPass and SchedulingLoop;
- nodes: AgentLink (agent streams), AgentCommands (what agents are told), NodeAdmin;
- access: UserTokens (the Authority and the permissions are the front's);
- front: QueueQueries and QueueCommands, the one door for gRPC and the dashboard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.access.user_tokens import UserTokens
from gpuq.coordinator.changes.event_bus import EventBus
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.changes.watchers import Watchers
from gpuq.coordinator.cron_service import CronService
from gpuq.coordinator.front.cluster_history import ClusterHistory
from gpuq.coordinator.front.job_diagnosis import JobDiagnoses
from gpuq.coordinator.front.job_messages import JobMessages
from gpuq.coordinator.front.queue_commands import QueueCommands
from gpuq.coordinator.front.queue_queries import QueueQueries
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.memory_loader import MemoryLoader
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.nodes.agent_commands import AgentCommands
from gpuq.coordinator.nodes.agent_link import AgentLink
from gpuq.coordinator.nodes.node_admin import NodeAdmin
from gpuq.coordinator.notifications import Notifier
from gpuq.coordinator.scheduling.scheduling_loop import PassRequests, SchedulingLoop
from gpuq.coordinator.scheduling.scheduling_pass import SchedulingPass
from gpuq.coordinator.terminal_relay import Terminals
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.coordinator.workload.history_buckets import GpuHistory
from gpuq.coordinator.workload.idle_rules import IdleWatch
from gpuq.coordinator.workload.job_actions import JobActions
from gpuq.coordinator.workload.job_endings import JobEndings
from gpuq.coordinator.workload.job_samples import JobSamples
from gpuq.coordinator.workload.running_progress import RunningProgress
from gpuq.coordinator.workload.running_telemetry import RunningTelemetry
from gpuq.coordinator.workload.selection import SelectionResolver
from gpuq.coordinator.workload.submissions import Submissions
from gpuq.domain.model import Job, JobEvent
from gpuq.domain.states import JobState
from gpuq.signature_files import load_signatures
from gpuq.store.api import Store


@dataclass(slots=True)
class Coordinator:
    """Every part of one coordinator (see the module docstring), and its life: `start` loads
    memory from the store and starts the loops, `close` stops them."""

    settings: CoordinatorSettings
    store: Store
    clock: Callable[[], float]
    steady: Callable[[], float]
    bus: EventBus
    writer: StoreWriter
    jobs: LiveJobs
    nodes: NodeTable
    inputs: SchedulerInputs
    loader: MemoryLoader
    changes: JobChanges
    agents: AgentCommands
    arrays: ArrayTasks
    submissions: Submissions
    actions: JobActions
    endings: JobEndings
    telemetry: RunningTelemetry
    history: GpuHistory
    progress: RunningProgress
    idle: IdleWatch
    samples: JobSamples
    terminals: Terminals
    notifier: Notifier
    watchers: Watchers
    scheduling: SchedulingPass
    loop: SchedulingLoop
    node_admin: NodeAdmin
    tokens: UserTokens
    link: AgentLink
    chores: AsyncIOScheduler
    cron: CronService
    messages: JobMessages
    queries: QueueQueries
    commands: QueueCommands
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def wake(self) -> None:
        """Ask for a scheduling pass (many asks before it runs make one pass)."""
        self.loop.wake()

    def periodic_wake(self) -> None:
        """The periodic pass, for begin times and aging: only while jobs wait (an idle
        coordinator's loop stays asleep; a submission or a node's change wakes it anyway)."""
        if self.jobs.any_waiting():
            self.loop.wake()

    async def start(self) -> None:
        """Load memory from the store; nodes get a full heartbeat timeout to reconnect."""
        jobs = await self.loader.load()
        await self.arrays.load_dependencies(d for j in jobs for d in j.spec.dependencies)
        await self.tokens.load()
        self.endings.load(await self.writer.read(lambda s: s.given_up_starts()))
        self.writer.start()
        self._tasks.append(asyncio.create_task(self.loop.run(), name="scheduler"))
        self.notifier.start()
        self.wake()

    async def close(self) -> None:
        await self.loop.close()
        await self.scheduling.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for entry in self.nodes.nodes.values():
            if entry.session is not None:
                entry.session.close()
        await self.telemetry.close()
        await self.history.close()
        await self.notifier.close()
        await self.writer.close()


def _max_output(settings: CoordinatorSettings, job: Job) -> int | None:
    """The job's QOS's max_output, sent with its launch (None: the node's own applies)."""
    tier = settings.qos.get(job.qos)
    return tier.max_output if tier is not None else None


def stopped_running(
    event: JobEvent, idle: IdleWatch, telemetry: RunningTelemetry, progress: RunningProgress
) -> None:
    if event.from_state is JobState.RUNNING and event.to_state is not JobState.RUNNING:
        idle.forget(event.job_id)
        telemetry.forget([event.job_id])
        progress.forget(event.job_id)


def assemble(
    store: Store,
    settings: CoordinatorSettings,
    clock: Callable[[], float] = time.time,
    chores: AsyncIOScheduler | None = None,
    steady: Callable[[], float] = time.monotonic,
) -> Coordinator:
    """Make every part and wire them (see the module docstring). `chores`: the scheduler that
    runs periodic chores and cron entries (gpuq.coordinator.serving starts it). `clock` says
    when things happen (wall time, recorded and shown); `steady` measures how long a node has
    been silent (monotonic: NTP may step the wall clock, and a node's supervisors count their
    fence on their host's monotonic clock)."""
    chores = chores if chores is not None else AsyncIOScheduler()
    bus = EventBus()
    writer = StoreWriter(store, bus.committed, settings.store_write_timeout)
    inputs = SchedulerInputs(settings)
    jobs = LiveJobs(inputs.key, lambda job: inputs.priority(job, inputs.ranked_at))
    nodes = NodeTable(settings.partitions)
    loader = MemoryLoader(writer, jobs, nodes, inputs, clock, steady)
    requests = PassRequests()
    wake = requests.wake
    agents = AgentCommands(
        jobs, nodes, inputs.time_limit_seconds, settings.kill_grace, partial(_max_output, settings)
    )
    changes = JobChanges(writer, jobs, nodes, inputs, bus, agents, clock)
    arrays = ArrayTasks(writer, jobs, inputs, changes, loader)
    scheduling = SchedulingPass(settings, jobs, nodes, inputs, arrays, changes, wake, steady)
    submissions = Submissions(
        settings, writer, jobs, nodes, arrays, changes, scheduling, wake, clock
    )
    selections = SelectionResolver(writer, jobs, arrays)
    actions = JobActions(settings, jobs, nodes, arrays, selections, changes, wake)
    telemetry = RunningTelemetry(writer, jobs, clock)
    progress = RunningProgress(jobs, clock)
    history = GpuHistory(writer, jobs, nodes, settings.gpu_history_days, clock)
    idle = IdleWatch()
    endings = JobEndings(settings, jobs, inputs, telemetry, changes, wake)
    samples = JobSamples(
        settings, jobs, idle, telemetry, history, progress, actions, changes, clock
    )
    # the grace of an unattached interactive job is a duration: on the steady clock
    terminals = Terminals(writer, jobs, nodes, actions, steady)
    notifier = Notifier(settings, writer, jobs, nodes, inputs, clock)
    watchers = Watchers(jobs.is_live)
    loop = SchedulingLoop(requests, scheduling, jobs, inputs, loader, bus)
    node_admin = NodeAdmin(settings, writer, jobs, nodes, endings, wake, clock, steady)
    tokens = UserTokens(writer, clock)
    link = AgentLink(
        settings, writer, jobs, nodes, endings, samples, terminals, agents, wake, clock, steady
    )
    cron = CronService(writer, submissions, chores, clock)
    messages = JobMessages(
        settings.private_data,
        idle.flags,
        scheduling.pending_detail,
        scheduling.explained,
        progress.shown,
    )
    cluster = ClusterHistory(writer, jobs, nodes, history, settings.private_data, clock)
    # gpuq's failure signatures and the admin's: a bad file fails here, at start
    signatures = load_signatures(settings.diagnosis_signatures)
    diagnoses = JobDiagnoses(writer, signatures, inputs.time_limit_seconds, idle.flags)
    queries = QueueQueries(
        settings,
        writer,
        jobs,
        nodes,
        arrays,
        telemetry,
        watchers,
        cron,
        messages,
        inputs,
        cluster,
        diagnoses,
        clock,
    )
    commands = QueueCommands(
        settings, submissions, actions, node_admin, tokens, cron, jobs, endings
    )

    # ---- the reactions between parts ----------------------------------------------------------
    # every job event, once memory took it: watch streams first, then interactive terminals,
    # then mail and webhooks (metrics, when on, listen last: gpuq.coordinator.serving)
    bus.on_job_event(watchers.published)
    bus.on_job_event(terminals.published)
    bus.on_job_event(notifier.published)
    # a job that stopped running: its idle tracks, GPU figures and progress so far were about
    # that run
    bus.on_job_event(lambda event, job: stopped_running(event, idle, telemetry, progress))

    return Coordinator(
        settings=settings,
        store=store,
        clock=clock,
        steady=steady,
        bus=bus,
        writer=writer,
        jobs=jobs,
        nodes=nodes,
        inputs=inputs,
        loader=loader,
        changes=changes,
        agents=agents,
        arrays=arrays,
        submissions=submissions,
        actions=actions,
        endings=endings,
        telemetry=telemetry,
        history=history,
        progress=progress,
        idle=idle,
        samples=samples,
        terminals=terminals,
        notifier=notifier,
        watchers=watchers,
        scheduling=scheduling,
        loop=loop,
        node_admin=node_admin,
        tokens=tokens,
        link=link,
        chores=chores,
        cron=cron,
        messages=messages,
        queries=queries,
        commands=commands,
    )
