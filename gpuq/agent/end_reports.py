"""Job ends on their way to the coordinator, kept until it has recorded them.

An end (or a launch handed back, NOT_STARTED) leaves with the next message, carrying what only
the agent knows: a share job this agent stopped over its VRAM ends out_of_memory (its supervisor
says cancelled), the application XIDs the job caused join its reason, and its GPU telemetry goes
with it. The job's units are then checked in the heartbeat that leaves with the report, so the
coordinator never frees a unit that still has the job's processes on it. Ends stay (unacked)
until the coordinator acknowledges them, and go again in every registration until then; a start
needs no message (the coordinator already counts the job as running).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from google.protobuf import text_format

from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.agent.jobs.mps_daemons import MpsDaemons
from gpuq.agent.jobs.supervisor_reports import ReportKind, SupervisorReport
from gpuq.domain.states import JobState
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

# a report was queued: send soon, with a heartbeat that reads these units (the ended job's) anew
SendSoon = Callable[[tuple[str, ...]], None]


class EndReports:
    def __init__(self, gpus: NodeGpus, mps: MpsDaemons, send_soon: SendSoon) -> None:
        self.gpus = gpus
        self.mps = mps
        self._send_soon = send_soon
        self.unacked: dict[int, SupervisorReport] = {}  # ended, not yet recorded by the coordinator
        self.outgoing: list[apb.JobReport] = []  # to send with the next message

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
        return taken

    def for_registration(self) -> list[apb.JobReport]:
        """Every end not yet acknowledged, for a registration (nothing else is resent)."""
        self.outgoing.clear()
        return [
            report_message(r, self.gpus.telemetry.ended_telemetry(r.job_id))
            for r in self.unacked.values()
        ]


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
    )
