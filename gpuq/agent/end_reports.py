"""Job ends on their way to the coordinator, kept until it has recorded them.

An end (or a launch handed back, NOT_STARTED) leaves with the next message, carrying what only
the agent knows: a share job this agent stopped over its VRAM ends out_of_memory (its supervisor
says cancelled), the application XIDs the job caused join its reason, its GPU telemetry goes
with it, and so does the tail of the output of a job that did not complete (the evidence of
`gpuq diagnose`, which the coordinator may have no other way to read: it may run as a service
user, or on another machine). Tails are bounded: OUTPUT_TAIL bytes a job, TAIL_BUDGET bytes a
message (reports past it go without theirs, so that ends always get through). The job's units
are then checked in the heartbeat that leaves with the report, so the coordinator never frees a
unit that still has the job's processes on it. Ends stay (unacked) until the coordinator
acknowledges them, and go again in every registration until then; a start needs no message (the
coordinator already counts the job as running).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable

from google.protobuf import text_format

from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.agent.jobs.mps_daemons import MpsDaemons
from gpuq.agent.jobs.supervisor_reports import ReportKind, SupervisorReport
from gpuq.domain.states import JobState
from gpuq.errors import GpuqError
from gpuq.output_tail import read_output_tail
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

# a report was queued: send soon, with a heartbeat that reads these units (the ended job's) anew
SendSoon = Callable[[tuple[str, ...]], None]
OUTPUT_TAIL = 16 << 10  # bytes of an ended job's output sent with its end (half each when
# stdout and stderr are separate files: errors usually go to stderr)
TAIL_BUDGET = 2 << 20  # bytes of tails in one message to the coordinator, at most
TAIL_WAIT = 5.0  # seconds an output file may take to read before the end leaves without it


class EndReports:
    def __init__(
        self,
        gpus: NodeGpus,
        mps: MpsDaemons,
        send_soon: SendSoon,
        launch_spec_of: Callable[[int], LaunchSpec | None] = lambda job_id: None,
    ) -> None:
        self.gpus = gpus
        self.mps = mps
        self._send_soon = send_soon
        self._launch_spec_of = launch_spec_of
        self.unacked: dict[int, SupervisorReport] = {}  # ended, not yet recorded by the coordinator
        self.outgoing: list[apb.JobReport] = []  # to send with the next message
        self._reading: set[asyncio.Task[None]] = set()  # ends whose output tails are read

    def on_report(self, report: SupervisorReport) -> None:
        """What a supervisor (or the launch path) says of a job: ends go to the coordinator."""
        if report.kind not in (ReportKind.ENDED, ReportKind.NOT_STARTED):
            return
        self.mps.release(report.job_id)  # the last share job on a GPU stops its daemon
        ended = report.kind == ReportKind.ENDED
        if ended and report.end_state is not None:
            # a share over its VRAM ends out_of_memory (the supervisor says "cancelled")
            state = self.gpus.shares.end_state(report.job_id, report.end_state, report.reason)
            report = dataclasses.replace(report, end_state=state)
        if ended and (notes := self.gpus.xids.end_notes(report.job_id)):
            reason = f"{report.reason}; {notes}" if report.reason else notes
            report = dataclasses.replace(report, reason=reason)
        # only a job that did not complete sends its output's tail: read no spec for the others
        # (a file read per end, ~0.1 ms of the agent's CPU per job in a drain)
        failed = ended and report.end_state is not JobState.COMPLETED
        spec = self._launch_spec_of(report.job_id) if failed else None
        if spec is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no loop (a test's direct call): read it here
                report = dataclasses.replace(report, output_tail=output_tail_of(spec))
            else:  # off the loop: an output file on a stalled network mount blocks its reader
                task = asyncio.create_task(self._with_tail(report, spec))
                self._reading.add(task)
                task.add_done_callback(self._reading.discard)
                return
        self._queue(report)

    async def _with_tail(self, report: SupervisorReport, spec: LaunchSpec) -> None:
        """Queue the report with its output's tail (none if reading takes over TAIL_WAIT)."""
        try:
            tail = await asyncio.wait_for(asyncio.to_thread(output_tail_of, spec), TAIL_WAIT)
            report = dataclasses.replace(report, output_tail=tail)
        except TimeoutError:
            log.warning("job %d: its output did not answer in %g s", report.job_id, TAIL_WAIT)
        self._queue(report)

    def _queue(self, report: SupervisorReport) -> None:
        """The report leaves with the next message, and is kept until acknowledged."""
        ended = report.kind == ReportKind.ENDED
        # its GPU telemetry goes with the report (and again, until acknowledged); an agent
        # that restarted has none of a job's time before
        telemetry = self.gpus.telemetry.end_telemetry(report.job_id)
        if ended and telemetry is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job %d: GPU telemetry %s",
                report.job_id,
                text_format.MessageToString(telemetry, as_one_line=True),
            )
        # its units are checked in the heartbeat that leaves with this report
        held = self.gpus.job_ended(report.job_id)
        self.unacked[report.job_id] = report
        self.outgoing.append(report_message(report, telemetry if ended else None))
        self._send_soon(held)

    def acked(self, job_id: int) -> None:
        """The coordinator recorded the job's end."""
        self.unacked.pop(job_id, None)
        self.gpus.telemetry.forget(job_id)

    def take(self) -> list[apb.JobReport]:
        """The reports to send now."""
        taken, self.outgoing = self.outgoing, []
        return within_budget(taken)

    def for_registration(self) -> list[apb.JobReport]:
        """Every end not yet acknowledged, for a registration (nothing else is resent)."""
        self.outgoing.clear()
        return within_budget(
            report_message(r, self.gpus.telemetry.ended_telemetry(r.job_id))
            for r in self.unacked.values()
        )


def output_tail_of(spec: LaunchSpec) -> bytes:
    """The last OUTPUT_TAIL bytes of a job's output (stdout, then stderr when it is another
    file), read as the job's user may (gpuq.output_tail: only regular files of that user, no
    link followed); b"" when there is none or it cannot be read."""
    uid = spec.uid if spec.uid is not None else os.getuid()
    paths = [p for p in dict.fromkeys((spec.stdout_path, spec.stderr_path)) if p]
    paths = [p for p in paths if p != "/dev/null"]
    parts = []
    for path in paths:
        try:
            data, _, _ = read_output_tail(
                os.path.join(spec.cwd, path), uid, OUTPUT_TAIL // len(paths)
            )
        except (GpuqError, OSError):
            continue
        if data:
            parts.append(data if len(paths) == 1 else b"--- " + path.encode() + b" ---\n" + data)
    return b"\n".join(parts)[-OUTPUT_TAIL:]


def within_budget(messages: Iterable[apb.JobReport]) -> list[apb.JobReport]:
    """The reports, each output tail past TAIL_BUDGET bytes together left out."""
    kept, spent = [], 0
    for message in messages:
        spent += len(message.output_tail)
        if spent > TAIL_BUDGET:
            message.ClearField("output_tail")
        kept.append(message)
    return kept


def report_message(
    report: SupervisorReport, telemetry: pb.GpuTelemetry | None = None
) -> apb.JobReport:
    """The wire's form of a report."""
    if report.kind == ReportKind.RUNNING:
        return apb.JobReport(
            job_id=report.job_id, kind=apb.JobReport.RUNNING, at=report.at, attempt=report.attempt
        )
    if report.kind == ReportKind.NOT_STARTED:
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
        end_state=(report.end_state or JobState.FAILED).value,
        result=pb.JobResult(exit_code=report.exit_code, signal=report.signal, reason=report.reason),
        at=report.at,
        peak_mem=report.peak_mem,
        peak_gpu_mem=telemetry.peak_gpu_mem if telemetry is not None else 0,
        telemetry=telemetry,
        output_tail=report.output_tail,
    )
