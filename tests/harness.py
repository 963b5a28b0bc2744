"""An in-process coordinator for tests of coordinator logic: the real assembled coordinator
(gpuq.coordinator.server.assemble) over a real store, its real scheduling loop and memory, and
agents that speak to its AgentLink directly (an AgentSession stands for the stream) instead of
over gRPC from another process. Real-process tests (tests/e2e) keep what crosses processes:
gRPC, identity, agents, supervisors, signals.

- `run` assembles and starts a coordinator over a store, runs a test's body, closes it; a
  `Clock` a test moves by hand stands for time where a rule depends on it.
- `FakeAgent` is a node: it registers units (a fake-GPU spec as `--fake-gpus` takes, or a
  count), heartbeats, records the launches and stops it is sent, and reports ends.
- `InProcessClient` is a user (or an admin) calling the front door (co.queries, co.commands)
  as gpuq.client.Client calls it over gRPC: what a user sees and what is refused.
- `submit`, `cancel`, `connect`, `record_ends` reach the parts directly, below the front door.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from helpers import until

from gpuq.agent.fake.gpu_backend import parse_fake_spec
from gpuq.cli.edit import update_fields
from gpuq.config.settings import CoordinatorSettings
from gpuq.convert import event_from_proto, job_from_proto, spec_to_proto, unit_to_proto
from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.transitions import Ending
from gpuq.coordinator.memory.node_table import NodeEntry
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.coordinator.workload.job_actions import Outcome
from gpuq.coordinator.workload.selection import Filters, Selection
from gpuq.domain.dependencies import parse_job_ref
from gpuq.domain.model import Job, JobEvent, JobResult, JobSpec, Node
from gpuq.domain.states import JobState, parse_states
from gpuq.errors import ERROR_KINDS, GpuqError
from gpuq.identity import Caller
from gpuq.store.api import Store
from gpuq.submission import build_spec
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

TEST = Cause("test")
T = TypeVar("T")


@dataclass
class Clock:
    """A clock a test moves by hand."""

    now: float = 1_000_000.0
    moves: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.moves.append(seconds)


def run(
    store: Store,
    body: Callable[[Coordinator], Awaitable[None]],
    settings: CoordinatorSettings | None = None,
    clock: Callable[[], float] | None = None,
) -> None:
    """Assemble and start a coordinator over `store`, run `body`, close it."""

    async def main() -> None:
        settings_ = settings or CoordinatorSettings()
        # a clock moved by hand moves silences too (the steady clock, which they are measured by)
        co = (
            assemble(store, settings_, clock, steady=clock) if clock else assemble(store, settings_)
        )
        await co.start()
        try:
            await body(co)
        finally:
            await co.close()

    asyncio.run(main())


async def eventually(read: Callable[[], Awaitable[T | None]], timeout: float = 10.0) -> T:
    """Poll an asynchronous read (a query through the front door) until it gives something
    truthy; that. Fails at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await read()):
        assert loop.time() < deadline, f"timed out (last: {value!r})"
        await asyncio.sleep(0.01)
    return value


def user(name: str, admin: bool = False) -> Caller:
    return Caller(name, None, admin=admin)


async def submit(co: Coordinator, spec: JobSpec, owner: str, key: str | None = None) -> list[int]:
    return await co.submissions.submit(spec, owner, TEST, key)


async def cancel(
    co: Coordinator,
    ids: Iterable[str],
    owner: str,
    reason: str = "",
    *,
    admin: bool = False,
    filters: Filters | None = None,
) -> list[Outcome]:
    caller = user(owner, admin)
    cause = Cause.request("Cancel", owner)
    return await co.actions.cancel(Selection(tuple(ids), filters), caller, cause, reason)


async def save_node(co: Coordinator, node: Node) -> None:
    await co.writer.write(lambda tx: tx.save_node(node))


async def connect(co: Coordinator, node: Node) -> AgentSession:
    """A node whose agent is connected and heard from, without the agent link: for tests of
    what the coordinator does with nodes (drains, scheduling), not of the agent protocol."""
    await save_node(co, node)
    session = AgentSession(node.name)
    co.nodes.nodes[node.name] = NodeEntry(
        node, co.clock(), session, heard=True, heard_at=co.steady()
    )
    return session


async def record_ends(
    co: Coordinator, node: str, ends: Iterable[tuple[int, JobState, JobResult, float | None]]
) -> None:
    """Jobs whose processes are gone, as the agent on `node` reports them."""
    endings = [Ending(i, s, r.reason or s.value, r, at) for i, s, r, at in ends]
    await co.endings.record(endings, Cause.agent(node))


async def message_with(session: AgentSession, kind: str) -> apb.CoordinatorMessage:
    """The next message to the agent that carries `kind` (start, stop, ack)."""
    while True:
        message = await asyncio.wait_for(session.next_message(), 10)
        assert message is not None
        if getattr(message, kind):
            return message


# ---- agents -----------------------------------------------------------------------------------

GIB = 1 << 30


def fake_units(gpus: str | int, node: str, shared: Sequence[int] = ()) -> list[pb.GpuUnit]:
    """A node's units: for a spec ("4xA100-80GB", "1xH100-80GB,1xA100-40GB"), what a real agent
    with `--fake-gpus SPEC` registers (gpuq.agent.fake's inventory); for a count, units
    GPU-<node>-<i> named "fake" of 80 GiB (tests/e2e/raw_agent.py's). `shared`: the indices
    of the GPUs an admin shares ([agent] shared_gpus)."""
    if isinstance(gpus, int):
        units = [
            pb.GpuUnit(uuid=f"GPU-{node}-{i}", index=i, name="fake", memory=80 * GIB)
            for i in range(gpus)
        ]
    else:
        units = [unit_to_proto(u) for u in parse_fake_spec(gpus, node).units] if gpus else []
    for unit in units:
        unit.shared = unit.index in shared
    return units


class FakeAgent:
    """A node's agent, in process: it registers with the coordinator's AgentLink (its
    AgentSession stands for the stream), says its units are healthy, and records what it is
    sent: launches (`launches` in order, `running` until they end), stops, signals. It runs
    nothing: a test ends a job with `end` (or `end_all`), and a stop is answered with the end
    a real agent reports once the job is gone (unless answer_stops is False). `finish`: every
    job ends completed as soon as it starts (a queue of quick jobs)."""

    def __init__(
        self,
        co: Coordinator,
        node: str,
        gpus: str | int = 0,
        *,
        cpus: int = 16,
        mem: int = 64 * GIB,
        features: Sequence[str] = (),
        shared: Sequence[int] = (),
        answer_stops: bool = True,
        finish: bool = False,
    ) -> None:
        self.co = co
        self.node = node
        self.units = fake_units(gpus, node, shared)
        self.cpus = cpus
        self.mem = mem
        self.features = tuple(features)
        self.answer_stops = answer_stops
        self.finish = finish
        self.launches: list[apb.JobLaunch] = []
        self.running: dict[int, apb.JobLaunch] = {}
        self.stops: list[apb.StopJob] = []
        self.signals: list[apb.SignalJob] = []
        self.session = AgentSession(node)
        self._reader: asyncio.Task[None] | None = None

    @property
    def uuids(self) -> list[str]:
        return [u.uuid for u in self.units]

    async def connect(self) -> FakeAgent:
        """Register, and send the first heartbeat (until then no unit is given out)."""
        register = apb.Register(
            node=self.node,
            gpus=self.units,
            cpus=self.cpus,
            mem=self.mem,
            fake=True,
            features=list(self.features),
        )
        await self.co.link.register(register, self.session)
        self.beat()
        self._reader = asyncio.create_task(self._read(self.session), name=f"agent {self.node}")
        return self

    def beat(
        self,
        samples: Sequence[apb.JobSample] = (),
        usage: Sequence[pb.GpuUsage] | None = None,
        not_accepting: str = "",
        isolation: str = "",
        progress: Sequence[apb.JobProgress] = (),
    ) -> None:
        """A heartbeat: every unit ok unless `usage` says otherwise; the running jobs'
        `samples`; `not_accepting`: the agent cannot start jobs, and why; `isolation`: the
        node's GPU isolation now ("": unchanged); `progress`: the running jobs' progress
        lines as their output shows them."""
        if usage is None:
            usage = [pb.GpuUsage(uuid=u, health="ok") for u in self.uuids]
        heartbeat = apb.Heartbeat(
            at=self.co.clock(),
            usage=usage,
            jobs=samples,
            not_accepting=bool(not_accepting),
            not_accepting_reason=not_accepting,
            isolation=isolation,
            progress=progress,
        )
        self.co.link.heartbeat(self.node, heartbeat)

    async def _read(self, session: AgentSession) -> None:
        while (message := await session.next_message()) is not None:
            for launch in message.start:
                self.launches.append(launch)
                self.running[launch.job_id] = launch
            self.signals.extend(message.signal)
            for stop in message.stop:
                self.stops.append(stop)
                current = self.running.get(stop.job_id)
                if self.answer_stops and current is not None and current.attempt == stop.attempt:
                    del self.running[stop.job_id]
                    self.co.link.reports(self.node, [stopped_report(stop, self.co.clock())])
            if self.finish:
                self.end_all()

    def disconnect(self) -> None:
        """The stream ends (the node stays up until its heartbeat timeout)."""
        self.co.link.disconnected(self.node, self.session)
        if self._reader is not None:
            self._reader.cancel()

    async def started(self, job_id: int, timeout: float = 10.0) -> apb.JobLaunch:
        """The launch of `job_id`, once it reached this agent."""
        await until(lambda: job_id in self.running, timeout)
        return self.running[job_id]

    def end(
        self,
        job_id: int,
        exit_code: int = 0,
        signal: int | None = None,
        state: JobState | None = None,
    ) -> None:
        """The job's processes are gone: completed with exit code 0, else failed (or `state`,
        e.g. out_of_memory), reported as the agent reports an end."""
        launch = self.running.pop(job_id)
        failed = exit_code != 0 or signal is not None
        end_state = state or (JobState.FAILED if failed else JobState.COMPLETED)
        report = apb.JobReport(
            job_id=job_id,
            kind=apb.JobReport.ENDED,
            end_state=end_state.value,
            result=pb.JobResult(
                exit_code=None if signal is not None else exit_code,
                signal=signal,
                reason=f"signal {signal}" if signal is not None else f"exit code {exit_code}",
            ),
            at=self.co.clock(),
            attempt=launch.attempt,
        )
        self.co.link.reports(self.node, [report])

    def end_all(self) -> list[int]:
        """End every running job, completed; their ids, in the order they started."""
        ended = list(self.running)
        for job_id in ended:
            self.end(job_id)
        return ended


async def started_on(agents: Iterable[FakeAgent], job_id: int, timeout: float = 10.0) -> FakeAgent:
    """The agent that `job_id`'s launch reached, once one did."""
    candidates = list(agents)
    await until(lambda: any(job_id in a.running for a in candidates), timeout)
    return next(a for a in candidates if job_id in a.running)


def stopped_report(stop: apb.StopJob, at: float) -> apb.JobReport:
    """What an agent reports once a stopped job's processes are gone (SIGTERM did it)."""
    return apb.JobReport(
        job_id=stop.job_id,
        kind=apb.JobReport.ENDED,
        end_state=stop.end_state,
        result=pb.JobResult(reason=stop.reason, signal=15),
        at=at,
        attempt=stop.attempt,
    )


async def passes_ran(co: Coordinator) -> None:
    """Until a scheduling pass has begun and ended since the call: one is asked for, and a
    second, which begins only after the first has ended."""
    before = co.loop.passes
    co.wake()
    await until(lambda: co.loop.passes > before)
    co.wake()
    await until(lambda: co.loop.passes > before + 1)


# ---- users, through the front door ------------------------------------------------------------


def refusal(result: queue_pb2.SubmitResult) -> GpuqError:
    """A refused submission as gpuq.client raises it: the error's kind, with its message."""
    kind = ERROR_KINDS.get(result.error_kind, GpuqError)
    error = kind.__new__(kind)
    Exception.__init__(error, result.message)
    return error


class InProcessClient:
    """gpuq.client.Client's calls, as one user makes them, to the coordinator's front door
    (co.queries, co.commands: what the gRPC servicer calls) instead of over gRPC: the same
    requests, the same replies, the same refusals. Submissions are built as the client builds
    them (gpuq.submission.build_spec), from the options of `gpuq submit`."""

    def __init__(self, co: Coordinator, name: str, *, admin: bool = False) -> None:
        self.co = co
        self.caller = Caller(name, 0 if name == "root" else None, admin=admin)

    async def submit(self, command: str = "true", **options: Any) -> int:
        """Submit `--wrap COMMAND` with sbatch-like options; the job (or array) id."""
        options.setdefault("environ", {})
        options.setdefault("chdir", "/tmp")
        [first, *_] = await self.submit_spec(build_spec(wrap=command, **options))
        return first

    async def submit_spec(self, spec: JobSpec, request_key: str | None = None) -> list[int]:
        request = queue_pb2.SubmitRequest(spec=spec_to_proto(spec), request_key=request_key)
        result = await self.co.commands.submit(self.caller, request)
        if result.code:
            raise refusal(result)
        return list(result.job_ids)

    async def detail_reply(self, job_id: int | str) -> queue_pb2.JobDetail:
        number, task = parse_job_ref(str(job_id))
        request = queue_pb2.GetJobRequest(job_id=number, task=task)
        return await self.co.queries.get_job(self.caller, request)

    async def get(self, job_id: int | str) -> Job:
        return job_from_proto((await self.detail_reply(job_id)).job)

    async def detail(self, job_id: int | str) -> tuple[pb.Job, list[JobEvent]]:
        reply = await self.detail_reply(job_id)
        return reply.job, [event_from_proto(e) for e in reply.events]

    async def array_states(self, array_job_id: int | str) -> dict[str, int]:
        return dict((await self.detail_reply(array_job_id)).array_states)

    async def list_raw(
        self,
        states: Iterable[str] = (),
        *,
        finished: bool = False,
        job_ids: Iterable[int] = (),
        array_job_id: int | None = None,
        expand_arrays: bool = False,
        names: Iterable[str] = (),
    ) -> list[pb.Job]:
        request = queue_pb2.ListJobsRequest(
            states=sorted(s.value for s in parse_states(states)),
            finished=finished,
            job_ids=list(job_ids),
            array_job_id=array_job_id,
            expand_arrays=expand_arrays,
            names=list(names),
        )
        reply = await self.co.queries.list_jobs(self.caller, request)  # as the wire has it
        return list(queue_pb2.ListJobsReply.FromString(reply).jobs)

    def nodes(self) -> list[queue_pb2.NodeInfo]:
        return list(self.co.queries.list_nodes().nodes)

    async def cancel(self, *job_ids: int | str, reason: str = "", **filters: Any) -> Outcomes:
        return await self._act("Cancel", job_ids, reason=reason, **filters)

    async def hold(self, *job_ids: int | str, **filters: Any) -> Outcomes:
        return await self._act("Hold", job_ids, **filters)

    async def release(self, *job_ids: int | str, **filters: Any) -> Outcomes:
        return await self._act("Release", job_ids, **filters)

    async def requeue(self, *job_ids: int | str, hold: bool = False, **filters: Any) -> Outcomes:
        return await self._act("Requeue", job_ids, hold=hold, **filters)

    async def _act(
        self,
        verb: str,
        job_ids: tuple[int | str, ...],
        reason: str = "",
        *,
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
        hold: bool = False,
    ) -> Outcomes:
        request = queue_pb2.JobSelection(
            job_ids=[str(j) for j in job_ids],
            reason=reason,
            user=user,
            states=list(states),
            name=name,
            hold=hold,
        )
        return list((await self.co.commands.act(verb, self.caller, request)).outcomes)

    async def fail_job(self, job_id: int, reason: str, attempt: int = 0) -> queue_pb2.ActionOutcome:
        """As Client.fail_job (srun's KillOnBadExit)."""
        request = queue_pb2.FailJobRequest(job_id=job_id, attempt=attempt, reason=reason)
        reply = await self.co.commands.fail_job(self.caller, request)
        outcome: queue_pb2.ActionOutcome = reply.outcomes[0]
        return outcome

    async def update(self, *job_ids: int | str, **changes: Any) -> Outcomes:
        """As Client.update: UpdateRequest's fields; `dependencies`, `begin_time`,
        `nodelist` and `exclude` replace (None or [] clears)."""
        request = queue_pb2.UpdateRequest(job_ids=[str(j) for j in job_ids])
        for key, value in changes.items():
            if key in ("dependencies", "begin_time", "nodelist", "exclude"):
                setattr(request, f"set_{key}", True)
                if value is None:
                    continue
                if key == "begin_time":
                    request.begin_time = value
                else:
                    getattr(request, key).extend(value)
            else:
                setattr(request, key, value)
        return list((await self.co.commands.update(self.caller, request)).outcomes)

    async def update_as_typed(self, *job_ids: int | str, **flags: str | bool) -> Outcomes:
        """`gpuq update JOB... --FLAG VALUE...`: the flags as typed (`time="0:00:03"`,
        `after="none"`, `hold=False` for --release), parsed as the command line parses them
        (gpuq.cli.edit.update_fields: bad input raises InvalidInput before any request)."""
        typed: dict[str, Any] = {name: flags.pop(name, None) for name in UPDATE_FLAGS}
        assert not flags, f"no such flag of gpuq update: {sorted(flags)}"
        return await self.update(*job_ids, **update_fields(**typed))

    async def state(self, job_id: int | str) -> str:
        return (await self.detail_reply(job_id)).job.state

    async def wait_state(self, job_id: int | str, *states: str, timeout: float = 10.0) -> Job:
        """The job, once it is in one of `states` (polled, with a deadline)."""

        async def read() -> Job | None:
            job = await self.get(job_id)
            return job if job.state.value in states else None

        return await eventually(read, timeout)


Outcomes = list[queue_pb2.ActionOutcome]
UPDATE_FLAGS = inspect.signature(update_fields).parameters
