"""A job's diagnosis for GetJob (`gpuq diagnose`, `gpuq show`, the dashboard's job page):
the evidence gathered (the job, its events as the caller sees them, what its nodes sent with
its latest start's end, its time limit, a running job's flags) and the pure rules of
gpuq.domain.diagnosis run over it, on demand, so that signatures an admin adds apply to past
jobs too.

Privacy (access/permissions): a job's output is its owner's and admins'. Anyone else gets the
verdicts of the structured evidence only: no output text, nor anything read from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuq.convert import diagnosis_to_proto
from gpuq.coordinator.access.permissions import is_owner_or_admin
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.domain.diagnosis import Diagnosis, EndEvidence, Evidence, diagnose
from gpuq.domain.log_signatures import Signature
from gpuq.domain.model import Job, JobEvent
from gpuq.domain.states import JobState
from gpuq.identity import Caller
from gpuq.v1 import queue_pb2

PRIVATE_OUTPUT = "its output is private to its owner and admins: these verdicts leave it out"
NO_OUTPUT = "no output was kept with its end (none written, or not readable by its agent)"


class JobDiagnoses:
    def __init__(
        self,
        writer: StoreWriter,
        signatures: Sequence[Signature],
        time_limit: Callable[[Job], int | None],
        flags: Callable[[int, int], tuple[str, ...]],
    ) -> None:
        self.writer = writer
        self.signatures = tuple(signatures)
        self.time_limit = time_limit
        self.flags = flags  # a running job's idle and hung flags (job id, its start)

    async def diagnosis(
        self, job: Job, events: Sequence[JobEvent], caller: Caller
    ) -> queue_pb2.Diagnosis:
        """The job's diagnosis as `caller` may see it; `events` as the caller sees them."""
        ends: list[EndEvidence] = []
        running = job.state is JobState.RUNNING
        # a running job's start has not ended: no read (its page polls every few seconds)
        if job.start_count and not running:
            stored = await self.writer.read(lambda s: s.end_evidence(job.id))
            order = {node: i for i, node in enumerate(job.node_names)}
            ends = sorted(
                (e for e in stored if e.attempt in (0, job.start_count)),
                key=lambda e: (order.get(e.node, len(order)), e.node),
            )
        note = ""
        if not is_owner_or_admin(caller, job.user):
            if any(e.output_tail for e in ends):
                note = PRIVATE_OUTPUT
            ends = [replace(e, output_tail="") for e in ends]
        elif ended_badly(job) and not any(e.output_tail for e in ends):
            note = NO_OUTPUT
        evidence = Evidence(
            job,
            tuple(events),
            tuple(ends),
            self.time_limit(job),
            self.flags(job.id, job.start_count) if running else (),
        )
        # regular expressions over a tail of up to 32 KiB: off the event loop
        verdicts = await asyncio.to_thread(diagnose, evidence, self.signatures)
        return diagnosis_to_proto(Diagnosis(verdicts, note))


def ended_badly(job: Job) -> bool:
    """Ended, and not completed: a job whose agent sends its output's tail."""
    return not job.state.is_live and job.state is not JobState.COMPLETED and job.start_count > 0
