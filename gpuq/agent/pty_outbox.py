"""Interactive jobs' terminal output on its way to the coordinator, at once and in order.

Output goes with the very next message (no heartbeat wait); consecutive output of one job shares
a PtyOutput up to MAX_CHUNK bytes. A job's output always leaves in a message before its end,
never beside it. When more than PTY_QUEUE_MAX bytes wait to be sent, no terminal is read until
they are (the job then blocks on its writes, as on a slow terminal).
"""

from __future__ import annotations

from collections.abc import Callable, Container

from gpuq.agent.jobs.pty_relay import MAX_CHUNK, PtyEvent, Terminals
from gpuq.v1 import agent_pb2 as apb

# bytes of terminal output waiting to be sent after which no terminal is read until they are
# sent (the job then blocks on its writes, as on a slow terminal)
PTY_QUEUE_MAX = 1 << 20


class PtyOutbox:
    """`flush`: have the next message sent now."""

    def __init__(self, terminals: Terminals, flush: Callable[[], None]) -> None:
        self.terminals = terminals
        self._flush = flush
        self.out: list[apb.PtyOutput] = []  # interactive jobs' output, to send at once
        self.size = 0  # bytes of data in `out`

    def add(self, event: PtyEvent) -> None:
        """An interactive job's output (or its end): out with the next message, at once."""
        last = self.out[-1] if self.out else None
        if (
            event.data
            and last is not None
            and (last.job_id, last.attempt) == (event.job_id, event.attempt)
            and not (last.closed or last.problem)
            and len(last.data) + len(event.data) <= MAX_CHUNK
        ):
            last.data += event.data
        else:
            self.out.append(
                apb.PtyOutput(
                    job_id=event.job_id,
                    attempt=event.attempt,
                    data=event.data,
                    closed=event.closed,
                    problem=event.problem,
                )
            )
        self.size += len(event.data)
        if self.size > PTY_QUEUE_MAX:
            self.terminals.throttle(True)
        self._flush()

    def take(self) -> list[apb.PtyOutput]:
        taken, self.out, self.size = self.out, [], 0
        return taken

    def sent(self) -> None:
        """What was taken is sent: terminals are read again unless too much waits still."""
        self.terminals.throttle(self.size > PTY_QUEUE_MAX)

    def new_session(self, unacked: Container[int]) -> None:
        """A new session: output of jobs whose end is unacknowledged is dropped (their end
        goes in the registration, and no output may follow it); pauses start over."""
        self.out = [out for out in self.out if out.job_id not in unacked]
        self.size = sum(len(out.data) for out in self.out)
        self.terminals.resume_all()
        self.terminals.throttle(self.size > PTY_QUEUE_MAX)
