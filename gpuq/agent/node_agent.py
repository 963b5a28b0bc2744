"""The node agent: registers its GPUs, starts and stops jobs through supervisors, reports back.

It keeps one stream to the coordinator and reconnects with backoff when it breaks. Nothing it
holds is precious: the supervisors own the jobs, and an ended job's result stays on disk until
the coordinator acknowledges it, so an agent (or coordinator) restart loses nothing.
Reports go out batched: everything that happened since the last send leaves in one message.

This module is the stream: sessions, the registration, what the coordinator says (launches go
to gpuq.agent.launcher, which orders them), and the one writer that sends reports
(gpuq.agent.end_reports), terminal output (gpuq.agent.pty_outbox) and heartbeats. An agent that
loses its coordinator for too long stops its jobs (gpuq.agent.fencing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpuq import __version__
from gpuq.agent.end_reports import EndReports
from gpuq.agent.fencing import Fence
from gpuq.agent.gpu.backend import GpuBackend
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.agent.jobs.job_cgroups import JobSubtree
from gpuq.agent.jobs.launch_spec import cgroup_key
from gpuq.agent.jobs.mps_daemons import MpsDaemons
from gpuq.agent.jobs.mps_node_scan import NodeWideMpsScan
from gpuq.agent.jobs.supervisor_reports import ReportKind, SupervisorReport, job_state
from gpuq.agent.jobs.supervisors import Supervisors
from gpuq.agent.launcher import Launcher
from gpuq.agent.output_watch import Findings, OutputWatch
from gpuq.agent.progress_watch import ProgressWatch
from gpuq.agent.pty_outbox import PtyOutbox
from gpuq.config.settings import AgentSettings, split_addresses
from gpuq.convert import unit_to_proto
from gpuq.domain.states import JobState
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
# gRPC keepalive on the agent's channel: the coordinator sends nothing on its own (an echo of
# a heartbeat only follows a heartbeat), so a silent cut (packets dropped, no reset) is noticed
# by pings left unanswered; the job leases do not depend on it (gpuq.agent.fencing). An agent pings
# every fence_time / 4 (1 to 5 s) and gives the connection up after as long without an answer;
# the coordinator lets agents ping every KEEPALIVE_MIN / 2 (server.py).
KEEPALIVE_MIN = 1.0
KEEPALIVE_MAX = 5.0


@dataclass(frozen=True, slots=True)
class AgentOptions:
    settings: AgentSettings
    address: str  # "unix:PATH" or "HOST:PORT"
    node_key: str  # this node's key (gpuq.identity): the coordinator knows it by it
    run_dir: Path  # job folders and the supervisors' socket
    heartbeat_interval: float = 5.0
    # the uid of [coordinator] service_user: a coordinator socket it owns serves every user
    service_uid: int | None = None


class Agent:
    def __init__(self, options: AgentOptions, backend: GpuBackend, fork_server: ForkServer) -> None:
        self.options = options
        self.backend = backend
        s = options.settings
        self.supervisors = Supervisors(
            options.run_dir,
            lambda report: self.reports.on_report(report),
            fork_server=fork_server,
            on_health=self._beat_now,
            on_pty=lambda event: self.pty.add(event),
            on_isolation=self._job_isolation,
        )
        # the installation's own level of job cgroups (<parent>/<key>/job_<id>): the GPU
        # processes of another installation's jobs are never taken for this one's
        key = cgroup_key(str(Path(options.run_dir).absolute()), s.node_name)
        parent = (s.cgroup_parent or "gpuq").strip("/")
        # the delegated cgroup v2 subtree for job cgroups (logs where there is none on systemd)
        self.job_subtree = JobSubtree(s.cgroup_parent)
        self.mps = MpsDaemons(
            options.run_dir,
            fake=backend.inventory().fake,
            set_compute_mode=getattr(backend, "set_compute_mode", None),
        )
        self.gpus = NodeGpus(
            backend,
            dataclasses.replace(s, cgroup_parent=f"{parent}/{key}"),
            self.supervisors,
            beat_now=self._beat_now,
            units_changed=self._units_changed,
            stop_job=self._stop_for_gpu,
            mps=self.mps,  # its processes are never foreign; share jobs release it
            cgroup_problem=lambda: self.job_subtree.problem,
        )
        self._flush = asyncio.Event()
        self._beat_due = False  # a heartbeat goes with the next message, due or not
        self._fresh_units: set[str] = set()  # ... reading these units anew (ended jobs')
        self.reports = EndReports(
            self.gpus, self.mps, self._send_soon, self.supervisors.launch_spec_of
        )
        self.pty = PtyOutbox(self.supervisors.terminals, self._flush.set)
        self.outputs = OutputWatch(self.supervisors.launch_spec_of, s.max_output)
        self.progress = ProgressWatch(
            self.supervisors.launch_spec_of,
            s.sample_interval,
            attempt_of=self.supervisors.attempt_of,
        )
        self.launcher = Launcher(
            self.supervisors,
            self.gpus,
            self.mps,
            self.reports,
            settings=s,
            address=options.address,
            cgroup_key=key,
            job_subtree=self.job_subtree,
            service_uid=options.service_uid,
        )
        self.connected = asyncio.Event()
        self.fence = Fence(s.fence_time, self.supervisors)
        # the coordinator echoes heartbeats (CoordinatorMessage.seen); one that does not (an
        # older version) has leases follow the connection instead
        self._echoes = True
        self.mps_scan = NodeWideMpsScan(self.mps.is_ours)
        self._session_task: asyncio.Task[None] | None = None
        self._reregistering = False  # the session is being ended to register anew
        self._last_usage: list[pb.GpuUsage] = []
        self._not_accepting: str | None = None  # as the last heartbeat said

    async def run(self) -> None:
        """Serve until cancelled; supervisors and jobs outlive the agent."""
        await self.supervisors.start()
        self.launcher.adopt_shares()
        gpu_duties = asyncio.create_task(self.gpus.run(), name="gpu-duties")
        delay = 0.05
        try:
            while True:
                try:
                    if not await self._run_session():
                        continue  # the GPUs changed: register them at once
                    delay = 0.05
                    if self.connected.is_set():
                        self.fence.lost()
                except grpc.aio.AioRpcError as error:
                    if self.connected.is_set():
                        self.fence.lost()
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
            gpu_duties.cancel()
            await asyncio.gather(gpu_duties, return_exceptions=True)
            await self.mps.close()
            await self.supervisors.close()
            await asyncio.to_thread(self.backend.close)

    async def settle(self, timeout: float) -> None:
        """On a clean stop: give the coordinator up to `timeout` seconds to record the ends
        already reported, so that ended jobs' folders are removed now rather than kept for
        the next start (a job that ended just before Ctrl-C is the usual case)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.reports.unacked and self.connected.is_set():
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
        self.launcher.node_changed()
        if self._session_task is not None and not self._session_task.done():
            self._reregistering = True
            self._session_task.cancel()

    async def _stop_for_gpu(
        self, job_id: int, end_state: JobState, reason: str, grace: float
    ) -> None:
        """End a job whose GPU failed (a hardware XID; its QOS decides on a requeue), or a
        share job over its VRAM (out_of_memory)."""
        await self.supervisors.stop(job_id, end_state, reason, 0, grace)

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
            # no bandwidth probe after each message received (with the coordinator's, it
            # was most of an idle node's gRPC wakeups): the window stays gRPC's default, ample
            # for the largest launch on a lab's network
            ("grpc.http2.bdp_probe", 0),
        ]

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
            ended = self.reports.for_registration()  # what was unsent is rebuilt into it
            self.pty.new_session(self.reports.unacked)
            registration = self._registration(ended)
            await call.write(apb.AgentMessage(register=registration))
            first = await call.read()
            if first is grpc.aio.EOF or not first.HasField("registered"):
                return False
            interval = first.registered.heartbeat_interval or self.options.heartbeat_interval
            self._echoes = first.seen > 0
            if not self._echoes:
                log.warning(
                    "the coordinator does not confirm heartbeats (an older version): job "
                    "leases follow the connection, and a frozen agent's jobs are fenced late"
                )
            self.fence.confirm(first.seen or registration.sent)
            self.connected.set()
            log.info("registered with the coordinator at %s", address)
            sender = asyncio.create_task(self._send(call, interval))
            try:
                await self._handle(first)
                while (message := await call.read()) is not grpc.aio.EOF:
                    if message.seen:
                        self.fence.confirm(message.seen)
                    await self._handle(message)
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        return True

    def _registration(self, ended: list[apb.JobReport]) -> apb.Register:
        """This node, its units and its jobs: running ones, those held before they go back to
        the queue (to the coordinator they still run here), and `ended` (not acknowledged)."""
        s = self.options.settings
        jobs = [
            apb.JobReport(
                job_id=job_id,
                kind=apb.JobReport.RUNNING,
                attempt=self.supervisors.attempt_of(job_id),
            )
            for job_id in self.supervisors.running_jobs()
            if job_id not in self.reports.unacked
        ]
        jobs += self.launcher.held_jobs()
        jobs += ended
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
            sent=time.monotonic(),
            fence_time=s.fence_time,
        )

    # ---- what the coordinator says ---------------------------------------------------------

    async def _handle(self, message: apb.CoordinatorMessage) -> None:
        if message.HasField("registered"):
            timeout = message.registered.node_timeout
            fence = self.options.settings.fence_time
            if timeout and fence >= timeout:
                log.warning(
                    "[agent] fence_time (%g s) is not shorter than the coordinator's "
                    "heartbeat_timeout (%g s): it waits for the fence before it gives this "
                    "node's jobs up, so they are requeued late",
                    fence,
                    timeout,
                )
        for job_id in message.ack:
            self.reports.acked(job_id)
            await self.supervisors.ack(job_id)
        for launch in message.start:
            await self.launcher.launch(launch)
        for stop in message.stop:
            await self._stop(stop)
        for sig in message.signal:
            await self.supervisors.signal(sig.job_id, sig.signal)
        for pty in message.pty:  # a terminal of a job this node runs with that attempt
            self.supervisors.terminals.input(
                pty.job_id,
                pty.attempt,
                data=pty.data,
                rows=pty.rows,
                cols=pty.cols,
                eof=pty.eof,
                pause=pty.pause,
                resume=pty.resume,
            )

    async def _stop(self, stop: apb.StopJob) -> None:
        if not self._stop_is_current(stop):
            log.info("ignoring a stop of job %d's start %d", stop.job_id, stop.attempt)
            return
        if self.launcher.release_held(stop.job_id):  # it never started: it ends as stopped
            self._report_gone(stop.job_id, stop.end_state, stop.attempt)
            return
        state = job_state(stop.end_state, JobState.CANCELLED)
        if state is JobState.FAILED:  # the coordinator's "failed" is cancelled here
            state = JobState.CANCELLED  # (only the agent's own checks end a job failed)
        known = await self.supervisors.stop(
            stop.job_id, state, stop.reason, stop.signal, stop.grace
        )
        if not known and stop.job_id not in self.reports.unacked:
            self._report_gone(stop.job_id, stop.end_state, stop.attempt)

    def _stop_is_current(self, stop: apb.StopJob) -> bool:
        """The stop is meant for the start of the job this node has (0: either side cannot
        tell, taken as meant for it)."""
        if stop.job_id in self.launcher.held:
            mine = self.launcher.held_attempts.get(stop.job_id, 0)
        else:
            mine = self.supervisors.attempt_of(stop.job_id)
        return stop.attempt == 0 or mine == 0 or stop.attempt == mine

    def _report_gone(self, job_id: int, end_state: str, attempt: int = 0) -> None:
        """The coordinator stops a job this node does not run: say it has ended (as the stop
        says; a state that names none is failed, as the coordinator takes it)."""
        state = job_state(end_state, JobState.FAILED) if end_state else JobState.CANCELLED
        self.reports.on_report(
            SupervisorReport(
                job_id,
                ReportKind.ENDED,
                state,
                reason=f"not running on {self.launcher.policy.node}",
                attempt=attempt,
            )
        )

    # ---- the one writer --------------------------------------------------------------------

    def _send_soon(self, units: tuple[str, ...]) -> None:
        """A report was queued: send it now, with a heartbeat that reads `units` anew (the
        ended job's: whether its processes left them)."""
        self._fresh_units.update(units)
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
                pty = self.pty.take()
                message.reports.extend(self.reports.take())
                fresh, self._fresh_units = self._fresh_units, set()
                if self._beat_due or fresh or loop.time() + BEAT_SLACK >= next_beat:
                    # a beat due at its time may reuse a sample taken moments ago; one made
                    # due by a health change reads the units now, one by jobs' ends the
                    # units they held
                    max_age = 0.0 if self._beat_due else min(self._sample_interval, interval) / 2
                    self._beat_due = False
                    started = self.supervisors.started_jobs()
                    read = await asyncio.to_thread(self._beat_reads, max_age, fresh, started)
                    usage, outputs, progress = read
                    if usage is None:
                        usage = self._last_usage
                    message.heartbeat.CopyFrom(self._heartbeat(usage))
                    await self._stop_over_output(outputs)
                    message.heartbeat.output_gone.extend(outputs.gone)
                    message.heartbeat.progress.extend(progress)
                    beat.cancel()
                    next_beat = loop.time() + interval
                    beat = loop.call_at(next_beat, self._flush.set)
                if pty and message.reports:
                    # a job's output in a message before its end, never beside it
                    await call.write(apb.AgentMessage(pty=pty))
                elif pty:
                    message.pty.extend(pty)
                if message.reports or message.HasField("heartbeat") or message.pty:
                    if message.HasField("heartbeat"):
                        # the mark the coordinator echoes once it took this as a sign of life
                        message.heartbeat.sent = time.monotonic()
                    await call.write(message)
                    last_sent = loop.time()
                    if message.HasField("heartbeat") and not self._echoes:
                        self.fence.confirm(message.heartbeat.sent)
                if pty:
                    self.pty.sent()
        finally:
            beat.cancel()

    def _beat_reads(
        self, max_age: float, fresh: Collection[str], started: list[int]
    ) -> tuple[list[pb.GpuUsage] | None, Findings, list[apb.JobProgress]]:
        """What a heartbeat reads, in one thread (any of it may block: NVML, an output file on
        a stalled mount): the units' figures (_usage), the started jobs' output files
        (gpuq.agent.output_watch) and their progress (gpuq.agent.progress_watch). One thread
        hop, not one per read: each hop cost the agent ~0.1 ms of CPU per message in a drain."""
        return self._usage(max_age, fresh), self.outputs.check(started), self._progress(started)

    async def _stop_over_output(self, findings: Findings) -> None:
        """A job over its max_output is stopped, failed "output limit: ..."."""
        for job_id, reason, grace in findings.over:
            log.warning("job %d: %s", job_id, reason)
            await self.supervisors.stop(job_id, JobState.FAILED, reason, 0, grace)

    def _progress(self, started: list[int]) -> list[apb.JobProgress]:
        """The running jobs' progress from their output's tail; none when reading failed in a
        way it did not catch: a heartbeat must never die of it."""
        try:
            return self.progress.check(started)
        except Exception:
            log.exception("reading the jobs' progress failed; sending none")
            return []

    def _job_isolation(self, job_id: int, isolation: str) -> None:
        """A job's device isolation: a failed load makes the node's claim advisory (and a later
        success undoes it); the coordinator hears it at once."""
        if self.gpus.device_loads.seen(job_id, isolation):
            self._beat_now()

    def _beat_now(self) -> None:
        """Whether this node can start jobs may have changed: tell the coordinator at once."""
        self._beat_due = True
        self._flush.set()

    def _heartbeat(self, usage: list[pb.GpuUsage]) -> apb.Heartbeat:
        """A heartbeat, which says whether this node takes work (the coordinator sends none to
        a node that does not, and shows why)."""
        reasons = (self.supervisors.forks.not_accepting(), self.mps_scan.problem)
        problem = "; ".join(p for p in reasons if p) or None
        if problem != self._not_accepting:
            if problem is not None:
                log.error("this node takes no work until it can start jobs again: %s", problem)
            else:
                log.warning("this node can start jobs again; it takes work")
            self._not_accepting = problem
        return apb.Heartbeat(
            at=time.time(),
            usage=usage,
            jobs=self.gpus.telemetry.job_samples(),
            not_accepting=problem is not None,
            not_accepting_reason=problem or "",
            isolation=self.gpus.isolation(),
        )

    @property
    def _sample_interval(self) -> float:
        return self.options.settings.sample_interval

    def _usage(self, max_age: float = 0.0, fresh: Collection[str] = ()) -> list[pb.GpuUsage] | None:
        """The units' figures and health (from a read at most max_age seconds old, `fresh`
        ones read now); None (the last ones are sent again) when reading them failed in a way
        the backend did not catch: a heartbeat must never die of it."""
        self.mps_scan.scan()
        try:
            usage = self.gpus.reads.usage(max_age, fresh)
        except Exception:
            log.exception("reading GPU usage failed; sending the last figures")
            return None
        self._last_usage = usage
        return usage
