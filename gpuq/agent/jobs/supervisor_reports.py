"""What the agent hears of a job: it runs, it ended (with the result), or it never started.

A supervisor says the first two (its hello and its end, gpuq/agent/native/supervisor.c); the
third is the agent's own, for a launch it handed back (no supervisor ran it). The result's
`end_state` is a JobState value in result.json, which the supervisor writes (or the agent, for a
job whose supervisor died): a value that names no state counts as failed, as the coordinator
counts it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from gpuq.agent.jobs.job_folder import Message
from gpuq.domain.states import JobState


class ReportKind(StrEnum):
    """Which news a report carries (the wire's JobReport.kind)."""

    RUNNING = "running"
    ENDED = "ended"
    NOT_STARTED = "not_started"  # the agent's own: a launch it handed back, never run


def job_state(value: object, default: JobState) -> JobState:
    """The JobState a supervisor's or the coordinator's text names; `default` for "" or none,
    and for text that names no state."""
    try:
        return JobState(str(value)) if value else default
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class SupervisorReport:
    """What a supervisor said about its job: it runs, or it ended (with the result)."""

    job_id: int
    kind: ReportKind
    end_state: JobState | None  # the job's end for ENDED, None otherwise
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    at: float = 0.0  # started_at for RUNNING, ended_at for ENDED
    peak_mem: int = 0
    leftovers_killed: int = 0
    attempt: int = 0  # which start of the job (the launch spec's attempt; 0: unknown)
    # the tail of its output, for a job that did not complete (gpuq.agent.end_reports)
    output_tail: bytes = b""

    @classmethod
    def ended(cls, result: Message, attempt: int = 0) -> SupervisorReport:
        return cls(
            attempt=attempt,
            job_id=int(result["job_id"]),
            kind=ReportKind.ENDED,
            end_state=job_state(result["end_state"], JobState.FAILED),
            exit_code=result.get("exit_code"),
            signal=result.get("signal"),
            reason=_with_isolation(str(result.get("reason", "")), result.get("isolation")),
            at=float(result.get("ended_at") or time.time()),
            peak_mem=int(result.get("peak_mem") or 0),
            leftovers_killed=int(result.get("leftovers_killed") or 0),
        )


def _with_isolation(reason: str, isolation: object) -> str:
    """The end reason, with the isolation the job had when it was not enforced (its device
    rules could not be applied): a job's record never hides that."""
    if not isinstance(isolation, str) or not isolation.startswith("advisory"):
        return reason
    note = f"GPU isolation {isolation}"
    return f"{reason}; {note}" if reason else note
