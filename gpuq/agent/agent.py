"""The node agent: registers its GPUs, starts and stops jobs through supervisors, reports back.

It keeps one stream to the coordinator and reconnects with backoff when it breaks. Nothing it
holds is precious: the supervisors own the jobs, and an ended job's result stays on disk until
the coordinator acknowledges it, so an agent (or coordinator) restart loses nothing.
Reports go out batched: everything that happened since the last send leaves in one message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import text_format

from gpuq import __version__
from gpuq.agent.gpu.backend import GpuBackend
from gpuq.agent.gpu.node_gpus import GpuCare
from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.agent.jobs.launch_spec import (
    Account,
    LaunchOrder,
    NodePolicy,
    build_launch,
    cgroup_key,
    launch_refusal,
)
from gpuq.agent.jobs.mps_daemons import MpsDaemons, MpsError, MpsShare, node_wide_mps
from gpuq.agent.jobs.pty_relay import MAX_CHUNK, PtyEvent
from gpuq.agent.jobs.supervisors import (
    LaunchRefused,
    SupervisorHub,
    SupervisorReport,
    coordinator_socket_owner,
    lookup_account,
)
from gpuq.config import AgentSettings, split_addresses
from gpuq.convert import spec_from_proto, unit_to_proto
from gpuq.domain.units import parse_size
from gpuq.identity import node_metadata
from gpuq.tls import agent_channel
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)
RECONNECT_MAX = 2.0  # seconds between attempts, at most
SEND_GAP = 0.005  # seconds between two messages to the coordinator, at least
BEAT_SLACK = 0.01  # seconds early a heartbeat may go (timers can fire a little early)
# a launch this node cannot start (its fork server is down) is reported this much later, so that
# a coordinator that sends it straight back here does not spin
REFUSE_HOLD = 5.0
# a fenced job gets this long between SIGTERM and SIGKILL (fence_time plus this must stay
# under the coordinator's node timeout: 240 + 10 < 300 by default)
FENCE_GRACE = 10.0
FENCE_CHECK_MAX = 1.0  # seconds between two looks at how long the coordinator has been away
# gRPC keepalive on the agent's channel: the coordinator sends nothing on its own, so a silent
# cut (packets dropped, no reset) is noticed only by pings left unanswered. An agent pings
# every fence_time / 4 (1 to 5 s) and gives the connection up after as long without an answer;
# the coordinator lets agents ping every KEEPALIVE_MIN / 2 (server.py).
KEEPALIVE_MIN = 1.0
KEEPALIVE_MAX = 5.0
MPS_SCAN_EVERY = 1.0  # seconds between two looks for a node-wide MPS daemon, at least
# bytes of terminal output waiting to be sent after which no terminal is read until they are
# sent (the job then blocks on its writes, as on a slow terminal)
PTY_QUEUE_MAX = 1 << 20


@dataclass(frozen=True, slots=True)
class AgentOptions:
    settings: AgentSettings
    address: str  # "unix:PATH" or "HOST:PORT"
    node_key: str  # this node's key (gpuq.identity): the coordinator knows it by it
    run_dir: Path  # job folders and the supervisors' socket
    heartbeat_interval: float = 5.0


class Agent:
    def __init__(self, options: AgentOptions, backend: GpuBackend, fork_server: ForkServer) -> None:
        self.options = options
        self.backend = backend
        self.hub = SupervisorHub(
            options.run_dir,
            self._on_report,
            fork_server=fork_server,
            on_health=self._beat_now,
            on_pty=self._on_pty,
        )
        # the installation's own level of job cgroups (<parent>/<key>/job_<id>): the GPU
        # processes of another installation's jobs are never taken for this one's
        s = options.settings
        self.cgroup_key = cgroup_key(str(Path(options.run_dir).absolute()), s.node_name)
        parent = (s.cgroup_parent or "gpuq").strip("/")
        self.gpus = GpuCare(
            backend,
            dataclasses.replace(s, cgroup_parent=f"{parent}/{self.cgroup_key}"),
            self.hub,
            beat_now=self._beat_now,
            units_changed=self._units_changed,
            stop_job=self._stop_for_gpu,
        )
        self.mps = MpsDaemons(
            options.run_dir,
            fake=self.gpus.inventory.fake,
            set_compute_mode=getattr(backend, "set_compute_mode", None),
        )
        self.gpus.mps = self.mps  # its processes are never foreign; share jobs release it
        self._mps_problem: str | None = None  # a node-wide MPS daemon runs (misconfigured)
        self._mps_scanned = -float("inf")  # monotonic time of the last look for one
        self.policy = self._policy()
        self._session_task: asyncio.Task[None] | None = None
        self._reregistering = False  # the session is being ended to register anew
        self.unacked: dict[int, SupervisorReport] = {}  # ended, not yet recorded by the coordinator
        self._outgoing: list[apb.JobReport] = []
        self._pty_out: list[apb.PtyOutput] = []  # interactive jobs' output, to send at once
        self._pty_bytes = 0  # of data in _pty_out
        self._flush = asyncio.Event()
        self._beat_due = False  # a heartbeat goes with the next message, due or not
        self._last_usage: list[pb.GpuUsage] = []
        self._not_accepting: str | None = None  # as the last heartbeat said
        self.refused: dict[int, asyncio.TimerHandle] = {}  # not started, to be handed back
        self.refused_attempts: dict[int, int] = {}  # their attempts
        self.connected = asyncio.Event()
        self.fenced: set[int] = set()  # jobs stopped because the coordinator was away too long
        # the last moment (monotonic) this agent knew a coordinator was there: while connected,
        # now; once a connection is lost, its last sign of life (see _lost)
        self.last_contact = time.monotonic()  # a new agent gives it the whole fence_time
        self._last_heard = self.last_contact  # the last message from the coordinator

    def _policy(self) -> NodePolicy:
        extra: dict[str, str] = {}
        state_dir = getattr(self.backend, "state_dir", None)
        if self.gpus.inventory.fake and state_dir is not None:
            extra["GPUQ_FAKE_GPU_DIR"] = str(state_dir)
        s = self.options.settings
        return NodePolicy(
            node=s.node_name,
            units=dict(self.gpus.units),
            visible_devices="index" if s.visible_devices == "index" else "uuid",
            job_env=dict(s.job_env),
            mem_enforcement=s.mem_enforcement,  # type: ignore[arg-type]
            cgroup_parent=s.cgroup_parent,
            cgroup_key=self.cgroup_key,
            extra_env=extra,
            devices=dict(self.gpus.device_numbers),
            switch_user=os.geteuid() == 0,  # a job runs as its submitter (the supervisor)
        )

    async def run(self) -> None:
        """Serve until cancelled; supervisors and jobs outlive the agent."""
        await self.hub.start()
        self._adopt_shares()
        fence = asyncio.create_task(self._fence(), name="fence")
        gpu_care = asyncio.create_task(self.gpus.run(), name="gpu-care")
        delay = 0.05
        try:
            while True:
                try:
                    if not await self._run_session():
                        continue  # the GPUs changed: register them at once
                    delay = 0.05
                    if self.connected.is_set():
                        self._lost(None)
                except grpc.aio.AioRpcError as error:
                    if self.connected.is_set():
                        self._lost(error)
                    if error.code() in (
                        grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.ALREADY_EXISTS,
                    ):
                        log.error("coordinator refused this agent: %s", error.details())
                    else:
                        log.info(
                            "coordinator unreachable (%s: %s); retrying",
                            error.code().name,
                            error.details(),
                        )
                self.connected.clear()
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX, delay * 2)
        finally:
            fence.cancel()
            gpu_care.cancel()
            await asyncio.gather(fence, gpu_care, return_exceptions=True)
            await self.mps.close()
            await self.hub.close()
            await asyncio.to_thread(self.backend.close)

    async def settle(self, timeout: float) -> None:
        """On a clean stop: give the coordinator up to `timeout` seconds to record the ends
        already reported, so that ended jobs' folders are removed now rather than kept for
        the next start (a job that ended just before Ctrl-C is the usual case)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.unacked and self.connected.is_set():
            if asyncio.get_running_loop().time() >= deadline:
                return
            await asyncio.sleep(0.02)

    async def _run_session(self) -> bool:
        """One session in a task of its own, so that a change of GPUs can end it (to register
        again) without cancelling the agent; False when it ended that way."""
        self._session_task = asyncio.create_task(self._session(), name="session")
        try:
            await self._session_task
        except asyncio.CancelledError:
            if not self._reregistering:
                raise
            self._reregistering = False
            self.connected.clear()
            return False
        finally:
            self._session_task = None
        return True

    def _units_changed(self) -> None:
        """The backend found other GPUs (a MIG change, a GPU reset): register them."""
        self.policy = self._policy()
        if self._session_task is not None and not self._session_task.done():
            self._reregistering = True
            self._session_task.cancel()

    async def _stop_for_gpu(self, job_id: int, end_state: str, reason: str, grace: float) -> None:
        """End a job whose GPU failed (a hardware XID; its QOS decides on a requeue), or a
        share job over its VRAM (out_of_memory)."""
        await self.hub.stop(job_id, end_state, reason, 0, grace)

    def _keepalive(self) -> tuple[float, float]:
        """(seconds between keepalive pings, seconds a ping may go unanswered)."""
        every = min(KEEPALIVE_MAX, max(KEEPALIVE_MIN, self.options.settings.fence_time / 4))
        return every, every

    def _channel_options(self) -> list[tuple[str, int]]:
        from gpuq.domain.limits import MAX_AGENT_MESSAGE_BYTES

        every, timeout = self._keepalive()
        return [
            # one coordinator message holds a launch of the largest valid job (grpc's default,
            # 4 MiB, does not); the coordinator splits larger batches to fit
            ("grpc.max_receive_message_length", MAX_AGENT_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", int(every * 1000)),
            ("grpc.keepalive_timeout_ms", int(timeout * 1000)),
            # grpc 1.85 times a keepalive ping out by this (default 60 s), not keepalive_timeout
            ("grpc.http2.ping_timeout_ms", int(timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def _lost(self, error: grpc.aio.AioRpcError | None) -> None:
        """The connection is gone: note when the coordinator was last known to be there.

        A connection the coordinator's side closed or reset (its process ended, it closed the
        stream) was there until now. One given up by keepalive (a silent cut) was last known to
        work when a ping was last answered, up to a ping interval plus its timeout ago; so is
        one that failed in a way this agent cannot tell (the fence rather early than late)."""
        now = time.monotonic()
        details = "" if error is None else (error.details() or "").lower()
        silent = "ping timeout" in details or "keepalive" in details
        if error is not None and (silent or not any(s in details for s in _PEER_CLOSED)):
            every, timeout = self._keepalive()
            now -= every + timeout
        self.last_contact = max(self._last_heard, now)

    async def _fence(self) -> None:
        """Stop this node's jobs once no coordinator has been known to be there for
        fence_time: by then the coordinator may be about to give them up (node timeout) and
        requeue them, and a job must never run in two places. The time counts from the last
        sign of life (see _lost), not from when the loss surfaced. They end node_fail, which
        is reported when a coordinator is back (and requeued as the job's QOS allows)."""
        limit = self.options.settings.fence_time
        while True:
            await asyncio.sleep(min(FENCE_CHECK_MAX, limit / 10))
            if self.connected.is_set():
                self.fenced.clear()
                continue
            if time.monotonic() - self.last_contact < limit:
                continue
            reason = f"fenced: no word from the coordinator for {limit:g} s"
            for job_id in self.hub.running_jobs():
                if job_id in self.fenced:
                    continue
                self.fenced.add(job_id)
                log.warning("job %d: %s; stopping it", job_id, reason)
                await self.hub.stop(job_id, "node_fail", reason, 0, FENCE_GRACE)

    async def _session(self) -> None:
        """One session with the first coordinator that accepts this agent's stream: the
        configured addresses (a leader and its standbys, comma-separated) are tried in order,
        an unreachable one passing to the next; the run loop starts over after a session."""
        addresses = split_addresses(self.options.address)
        for number, address in enumerate(addresses, 1):
            try:
                if await self._session_at(address):
                    return
            except grpc.aio.AioRpcError as error:
                last = number == len(addresses)
                if self.connected.is_set() or last or error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                log.debug("no coordinator at %s (%s); trying the next", address, error.code().name)

    async def _session_at(self, address: str) -> bool:
        """A session with the coordinator at `address`; False if it did not register us."""
        metadata = (node_metadata(self.options.settings.node_name, self.options.node_key),)
        async with agent_channel(
            address, self.options.settings, self._channel_options()
        ) as channel:
            stub = agent_pb2_grpc.AgentLinkStub(channel)
            call = stub.Connect(metadata=metadata)
            self._outgoing.clear()  # what was unsent is rebuilt into the registration
            self._new_pty_session()
            await call.write(apb.AgentMessage(register=self._registration()))
            first = await call.read()
            if first is grpc.aio.EOF or not first.HasField("registered"):
                return False
            interval = first.registered.heartbeat_interval or self.options.heartbeat_interval
            self._last_heard = time.monotonic()
            self.connected.set()
            log.info("registered with the coordinator at %s", address)
            sender = asyncio.create_task(self._send(call, interval))
            try:
                await self._handle(first)
                while (message := await call.read()) is not grpc.aio.EOF:
                    self._last_heard = time.monotonic()
                    await self._handle(message)
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        return True

    def _registration(self) -> apb.Register:
        s = self.options.settings
        jobs = [
            apb.JobReport(
                job_id=job_id, kind=apb.JobReport.RUNNING, attempt=self.hub.attempt_of(job_id)
            )
            for job_id in self.hub.running_jobs()
            if job_id not in self.unacked
        ]
        # held before they go back to the queue: to the coordinator they still run here
        jobs += [
            apb.JobReport(
                job_id=job_id,
                kind=apb.JobReport.RUNNING,
                attempt=self.refused_attempts.get(job_id, 0),
            )
            for job_id in self.refused
        ]
        jobs += [
            _report_message(r, self.gpus.ended_telemetry(r.job_id)) for r in self.unacked.values()
        ]
        cpus = s.cpus or os.cpu_count() or 1
        mem = (
            parse_size(s.mem, "agent mem")
            if s.mem
            else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        )
        inventory = self.gpus.inventory
        return apb.Register(
            node=s.node_name,
            gpus=[unit_to_proto(u) for u in inventory.units],
            topology=[pb.TopologyLink(a=a, b=b, distance=d) for a, b, d in inventory.topology],
            cpus=cpus,
            mem=mem,
            fake=inventory.fake,
            version=__version__,
            jobs=jobs,
            gpu_problem=inventory.problem,
            isolation=self.gpus.isolation(),
            driver=inventory.driver,
            features=list(s.features),
        )

    # ---- what the coordinator says ---------------------------------------------------------

    async def _handle(self, message: apb.CoordinatorMessage) -> None:
        if message.HasField("registered"):
            timeout = message.registered.node_timeout
            fence = self.options.settings.fence_time
            if timeout and fence >= timeout:
                log.warning(
                    "[agent] fence_time (%g s) is not shorter than the coordinator's "
                    "heartbeat_timeout (%g s): a job it gives up on may still run here",
                    fence,
                    timeout,
                )
        for job_id in message.ack:
            self.unacked.pop(job_id, None)
            self.gpus.forget(job_id)
            await self.hub.ack(job_id)
        for launch in message.start:
            await self._launch(launch)
        for stop in message.stop:
            if not self._stop_is_current(stop):
                log.info("ignoring a stop of job %d's start %d", stop.job_id, stop.attempt)
                continue
            if (held := self.refused.pop(stop.job_id, None)) is not None:
                held.cancel()  # it never started: it ends as the stop says
                self.refused_attempts.pop(stop.job_id, None)
                self._report_gone(stop.job_id, stop.end_state, stop.attempt)
                continue
            known = await self.hub.stop(
                stop.job_id, stop.end_state, stop.reason, stop.signal, stop.grace
            )
            if not known and stop.job_id not in self.unacked:
                self._report_gone(stop.job_id, stop.end_state, stop.attempt)
        for sig in message.signal:
            await self.hub.signal(sig.job_id, sig.signal)
        for pty in message.pty:  # a terminal of a job this node runs with that attempt
            self.hub.terminals.input(
                pty.job_id,
                pty.attempt,
                data=pty.data,
                rows=pty.rows,
                cols=pty.cols,
                eof=pty.eof,
                pause=pty.pause,
                resume=pty.resume,
            )

    def _stop_is_current(self, stop: apb.StopJob) -> bool:
        """The stop is meant for the start of the job this node has (0: either side cannot
        tell, taken as meant for it)."""
        if stop.job_id in self.refused:
            mine = self.refused_attempts.get(stop.job_id, 0)
        else:
            mine = self.hub.attempt_of(stop.job_id)
        return stop.attempt == 0 or mine == 0 or stop.attempt == mine

    async def _launch(self, launch: apb.JobLaunch) -> None:
        if launch.job_id in self.hub.running_jobs() or launch.job_id in self.unacked:
            # an earlier start of the job is still ending here (it was stopped as a stray)
            self._hand_back(launch.job_id, "an earlier start of the job is ending", launch.attempt)
            return
        try:
            order = LaunchOrder(
                job_id=launch.job_id,
                spec=spec_from_proto(launch.spec),
                gpus=tuple(launch.gpus),
                user=launch.user,
                time_limit=launch.time_limit or None,
                kill_grace=launch.kill_grace,
                array_job_id=launch.array_job_id if launch.HasField("array_job_id") else None,
                array_task_id=launch.array_task_id if launch.HasField("array_task_id") else None,
                requeue_count=launch.requeue_count,
                attempt=launch.attempt,
            )
            unknown = [uuid for uuid in order.gpus if uuid not in self.gpus.units]
            if unknown:
                raise LaunchRefused(f"it has no GPU {unknown[0]} (its GPUs changed)")
            # who the job runs as: its submitter's account here, if this node may run it
            account = lookup_account(order.user)
            refusal = launch_refusal(
                order.user,
                account,
                node=self.policy.node,
                agent_uid=os.geteuid(),
                allow_root_jobs=self.options.settings.allow_root_jobs,
                coordinator_owner=coordinator_socket_owner(split_addresses(self.options.address)),
            )
            if refusal is not None:
                log.error("job %d not started: %s", launch.job_id, refusal)
                self._on_report(
                    SupervisorReport(
                        launch.job_id, "ended", "failed", reason=refusal, attempt=launch.attempt
                    )
                )
                return
            mps = await self._share(order, launch.spec.resources, account)
            cpus = self.gpus.place(order.job_id, order.gpus, order.spec.resources.cpus)
            spec = build_launch(order, self.policy, cpus=cpus, account=account, mps=mps)
            # the units go with the spec, for an agent that restarts and adopts the job
            extra: dict[str, object] = {"gpus": list(order.gpus)}
            if mps is not None:
                extra["share_mem"] = mps.mem_limit
                self.gpus.set_share(order.job_id, mps.mem_limit)
            spec = dataclasses.replace(spec, extra={**spec.extra, **extra})
            await self.hub.launch(spec)
        except LaunchRefused as error:
            self.gpus.launch_failed(launch.job_id)
            self.gpus.release_share(launch.job_id)
            log.error("job %d not started: %s", launch.job_id, error)
            self._hand_back(launch.job_id, str(error), launch.attempt)
        except Exception as error:  # a launch that cannot even begin ends the job as failed
            self.gpus.launch_failed(launch.job_id)
            self.gpus.release_share(launch.job_id)
            log.exception("cannot launch job %d", launch.job_id)
            self._on_report(
                SupervisorReport(
                    launch.job_id,
                    "ended",
                    "failed",
                    reason=f"launch failed on {self.policy.node}: {error}",
                    attempt=launch.attempt,
                )
            )

    async def _share(
        self, order: LaunchOrder, resources: pb.Resources, account: Account | None
    ) -> MpsShare | None:
        """A share job's MPS daemon (started for its user if none runs on its GPU) and
        limits; None for any other job. LaunchRefused when it cannot have one here."""
        share = getattr(order.spec.resources, "gpu_share", None) or resources.gpu_share
        if not share:
            return None
        unit = self.gpus.units.get(order.gpus[0]) if len(order.gpus) == 1 else None
        if unit is None or not unit.shared:
            raise LaunchRefused(
                f"a GPU share needs one GPU listed in [agent] shared_gpus, not {order.gpus}"
            )
        mem_limit = order.spec.resources.gpu_mem or resources.gpu_mem
        if not mem_limit:
            raise LaunchRefused("a GPU share needs its VRAM limit (--gpu-mem)")
        if self.policy.switch_user and account is not None:
            uid, gid = account.uid, account.gid
        else:
            uid, gid = os.geteuid(), os.getegid()
        try:
            return await self.mps.acquire(
                order.job_id, unit.uuid, uid, gid, percent=int(share), mem_limit=mem_limit
            )
        except MpsError as error:
            raise LaunchRefused(str(error)) from error

    def _adopt_shares(self) -> None:
        """Share jobs an earlier agent started keep their GPU's daemon, which this agent
        takes over; a daemon no running share job uses is stopped."""
        self.mps.recover()
        for job_id in self.hub.running_jobs():
            spec = self.hub.launch_spec_of(job_id)
            if spec is not None and spec.extra.get("share_mem") and spec.extra.get("gpus"):
                self.mps.adopt(job_id, str(spec.extra["gpus"][0]))
        self.mps.stop_idle()

    def _hand_back(self, job_id: int, problem: str, attempt: int = 0) -> None:
        """The job did not start here: after REFUSE_HOLD, report it NOT_STARTED, which sends
        it back to the queue as it was (it never ran: not a requeue, not preempted)."""

        def report() -> None:
            if self.refused.pop(job_id, None) is not None:
                self.refused_attempts.pop(job_id, None)
                reason = f"not started: {self.policy.node} cannot start jobs ({problem})"
                self._on_report(
                    SupervisorReport(job_id, "not_started", None, reason=reason, attempt=attempt)
                )

        if job_id not in self.refused:
            self.refused[job_id] = asyncio.get_running_loop().call_later(REFUSE_HOLD, report)
            self.refused_attempts[job_id] = attempt

    def _report_gone(self, job_id: int, end_state: str, attempt: int = 0) -> None:
        """The coordinator stops a job this node does not run: say it has ended."""
        self._on_report(
            SupervisorReport(
                job_id,
                "ended",
                end_state or "cancelled",
                reason=f"not running on {self.policy.node}",
                attempt=attempt,
            )
        )

    # ---- what supervisors say --------------------------------------------------------------

    def _on_report(self, report: SupervisorReport) -> None:
        """Ends go to the coordinator (and stay until acknowledged); a start needs no message:
        the coordinator already counts the job as running."""
        if report.kind in ("ended", "not_started"):
            self.gpus.release_share(report.job_id)  # the last on a GPU stops its daemon
            if report.kind == "ended" and report.end_state is not None:
                # a share over its VRAM ends out_of_memory (the supervisor says "cancelled")
                state = self.gpus.end_state(report.job_id, report.end_state, report.reason)
                report = dataclasses.replace(report, end_state=state)
            if report.kind == "ended" and (notes := self.gpus.end_notes(report.job_id)):
                reason = f"{report.reason}; {notes}" if report.reason else notes
                report = dataclasses.replace(report, reason=reason)
            # its GPU telemetry goes with the report (and again, until acknowledged); an agent
            # that restarted has none of a job's time before
            telemetry = self.gpus.end_telemetry(report.job_id)
            if report.kind == "ended" and telemetry is not None and log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "job %d: GPU telemetry %s",
                    report.job_id,
                    text_format.MessageToString(telemetry, as_one_line=True),
                )
            if self.gpus.job_ended(report.job_id):
                # its units are checked in the heartbeat that leaves with this report, so the
                # coordinator never frees a unit that still has the job's processes on it
                self._beat_due = True
            self.unacked[report.job_id] = report
            self._outgoing.append(
                _report_message(report, telemetry if report.kind == "ended" else None)
            )
            self._flush.set()

    async def _send(self, call: grpc.aio.StreamStreamCall, interval: float) -> None:
        """One writer: whatever reports piled up, plus a heartbeat when one is due.

        Messages leave at least SEND_GAP apart: when idle a report leaves at once; under load,
        ends that come in quick succession share one message, and so one transaction at the
        coordinator. A timer marks heartbeats due (no task per wait)."""
        loop = asyncio.get_running_loop()
        next_beat = loop.time()
        beat = loop.call_soon(self._flush.set)
        last_sent = -SEND_GAP
        try:
            while True:
                await self._flush.wait()
                if (gap := last_sent + SEND_GAP - loop.time()) > 0:
                    await asyncio.sleep(gap)
                self._flush.clear()
                message = apb.AgentMessage()
                pty = self._take_pty()
                if self._outgoing:
                    message.reports.extend(self._outgoing)
                    self._outgoing.clear()
                if self._beat_due or loop.time() + BEAT_SLACK >= next_beat:
                    # a beat due at its time may reuse a sample taken moments ago; one made
                    # due (a job's end, a health change) reads the units now
                    max_age = 0.0 if self._beat_due else min(self._sample_interval, interval) / 2
                    self._beat_due = False
                    usage = await asyncio.to_thread(self._usage, max_age)
                    if usage is None:
                        usage = self._last_usage
                    message.heartbeat.CopyFrom(self._heartbeat(usage))
                    beat.cancel()
                    next_beat = loop.time() + interval
                    beat = loop.call_at(next_beat, self._flush.set)
                if pty and message.reports:
                    # a job's output in a message before its end, never beside it
                    await call.write(apb.AgentMessage(pty=pty))
                elif pty:
                    message.pty.extend(pty)
                if message.reports or message.HasField("heartbeat") or message.pty:
                    await call.write(message)
                    last_sent = loop.time()
                if pty:
                    self.hub.terminals.throttle(self._pty_bytes > PTY_QUEUE_MAX)
        finally:
            beat.cancel()

    def _on_pty(self, event: PtyEvent) -> None:
        """An interactive job's output (or its end): out with the next message, at once;
        consecutive output of one job shares a PtyOutput up to MAX_CHUNK bytes."""
        last = self._pty_out[-1] if self._pty_out else None
        if (
            event.data
            and last is not None
            and (last.job_id, last.attempt) == (event.job_id, event.attempt)
            and not (last.closed or last.problem)
            and len(last.data) + len(event.data) <= MAX_CHUNK
        ):
            last.data += event.data
        else:
            self._pty_out.append(
                apb.PtyOutput(
                    job_id=event.job_id,
                    attempt=event.attempt,
                    data=event.data,
                    closed=event.closed,
                    problem=event.problem,
                )
            )
        self._pty_bytes += len(event.data)
        if self._pty_bytes > PTY_QUEUE_MAX:
            self.hub.terminals.throttle(True)
        self._flush.set()

    def _take_pty(self) -> list[apb.PtyOutput]:
        taken, self._pty_out, self._pty_bytes = self._pty_out, [], 0
        return taken

    def _new_pty_session(self) -> None:
        """A new session: output of jobs whose end is unacknowledged is dropped (their end
        goes in the registration, and no output may follow it); pauses start over."""
        self._pty_out = [out for out in self._pty_out if out.job_id not in self.unacked]
        self._pty_bytes = sum(len(out.data) for out in self._pty_out)
        self.hub.terminals.resume_all()
        self.hub.terminals.throttle(self._pty_bytes > PTY_QUEUE_MAX)

    def _beat_now(self) -> None:
        """Whether this node can start jobs may have changed: tell the coordinator at once."""
        self._beat_due = True
        self._flush.set()

    def _heartbeat(self, usage: list[pb.GpuUsage]) -> apb.Heartbeat:
        """A heartbeat, which says whether this node takes work (the coordinator sends none to
        a node that does not, and shows why)."""
        problems = [p for p in (self.hub.not_accepting(), self._mps_problem) if p]
        problem = "; ".join(problems) or None
        if problem != self._not_accepting:
            if problem is not None:
                log.error("this node takes no work until it can start jobs again: %s", problem)
            else:
                log.warning("this node can start jobs again; it takes work")
            self._not_accepting = problem
        return apb.Heartbeat(
            at=time.time(),
            usage=usage,
            jobs=self.gpus.job_samples(),
            not_accepting=problem is not None,
            not_accepting_reason=problem or "",
        )

    @property
    def _sample_interval(self) -> float:
        return self.options.settings.sample_interval

    def _usage(self, max_age: float = 0.0) -> list[pb.GpuUsage] | None:
        """The units' figures and health (from a read at most max_age seconds old); None (the
        last ones are sent again) when reading them failed in a way the backend did not catch:
        a heartbeat must never die of it."""
        self._scan_mps()
        try:
            usage = self.gpus.usage(max_age)
        except Exception:
            log.exception("reading GPU usage failed; sending the last figures")
            return None
        self._last_usage = usage
        return usage

    def _scan_mps(self) -> None:
        """Look for an MPS daemon gpuq did not start (at most every MPS_SCAN_EVERY); one makes
        the node take no work (misconfigured) until it is gone. Blocking (/proc)."""
        if time.monotonic() - self._mps_scanned < MPS_SCAN_EVERY:
            return
        self._mps_scanned = time.monotonic()
        try:
            found = node_wide_mps(self.mps.is_ours)
        except Exception:
            log.exception("looking for a node-wide MPS daemon failed")
            return
        if found != self._mps_problem:
            if found is not None:
                log.error("%s", found)
            else:
                log.warning("the node-wide MPS daemon is gone")
            self._mps_problem = found


# how grpc words a connection the other side closed or reset (a sign of life up to that moment)
_PEER_CLOSED = ("socket closed", "connection reset", "broken pipe", "goaway received")


def _report_message(
    report: SupervisorReport, telemetry: pb.GpuTelemetry | None = None
) -> apb.JobReport:
    if report.kind == "running":
        return apb.JobReport(
            job_id=report.job_id, kind=apb.JobReport.RUNNING, at=report.at, attempt=report.attempt
        )
    if report.kind == "not_started":
        return apb.JobReport(
            job_id=report.job_id,
            kind=apb.JobReport.NOT_STARTED,
            result=pb.JobResult(reason=report.reason),
            at=report.at,
            attempt=report.attempt,
        )
    return apb.JobReport(
        job_id=report.job_id,
        attempt=report.attempt,
        kind=apb.JobReport.ENDED,
        end_state=report.end_state or "failed",
        result=pb.JobResult(exit_code=report.exit_code, signal=report.signal, reason=report.reason),
        at=report.at,
        peak_mem=report.peak_mem,
        peak_gpu_mem=telemetry.peak_gpu_mem if telemetry is not None else 0,
        telemetry=telemetry,
    )
