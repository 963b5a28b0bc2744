"""Fencing: a job must never run in two places, so an agent that has lost its coordinator for
too long stops its jobs itself.

The coordinator gives a silent node's jobs up after its node timeout and may requeue them; this
agent stops them once no coordinator has been known to be there for [agent] fence_time (which
must stay shorter than that timeout). The time counts from the last sign of life, not from when
the loss surfaced (see Fence.lost). Fenced jobs end node_fail, which is reported when a
coordinator is back (and requeued as the job's QOS allows).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from gpuq.agent.jobs.supervisors import Supervisors
from gpuq.domain.states import JobState

log = logging.getLogger(__name__)
# a fenced job gets this long between SIGTERM and SIGKILL (fence_time plus this must stay
# under the coordinator's node timeout: 240 + 10 < 300 by default)
FENCE_GRACE = 10.0
FENCE_CHECK_MAX = 1.0  # seconds between two looks at how long the coordinator has been away
# how grpc words a connection the other side closed or reset (a sign of life up to that moment)
_PEER_CLOSED = ("socket closed", "connection reset", "broken pipe", "goaway received")


class Fence:
    """`connected`: set while a session with a coordinator runs. `keepalive`: (seconds between
    keepalive pings, seconds a ping may go unanswered) on the agent's channel."""

    def __init__(
        self,
        fence_time: float,
        keepalive: tuple[float, float],
        connected: asyncio.Event,
        supervisors: Supervisors,
    ) -> None:
        self.limit = fence_time
        self.keepalive = keepalive
        self.connected = connected
        self.supervisors = supervisors
        self.fenced: set[int] = set()  # jobs stopped because the coordinator was away too long
        # the last moment (monotonic) this agent knew a coordinator was there: while connected,
        # now; once a connection is lost, its last sign of life (see lost)
        self.last_contact = time.monotonic()  # a new agent gives it the whole fence_time
        self.last_heard = self.last_contact  # the last message from the coordinator

    def heard(self) -> None:
        """A message from the coordinator came."""
        self.last_heard = time.monotonic()

    def lost(self, error: grpc.aio.AioRpcError | None) -> None:
        """The connection is gone: note when the coordinator was last known to be there.

        A connection the coordinator's side closed or reset (its process ended, it closed the
        stream) was there until now. One given up by keepalive (a silent cut) was last known to
        work when a ping was last answered, up to a ping interval plus its timeout ago; so is
        one that failed in a way this agent cannot tell (the fence rather early than late)."""
        now = time.monotonic()
        details = "" if error is None else (error.details() or "").lower()
        silent = "ping timeout" in details or "keepalive" in details
        if error is not None and (silent or not any(s in details for s in _PEER_CLOSED)):
            every, timeout = self.keepalive
            now -= every + timeout
        self.last_contact = max(self.last_heard, now)

    async def run(self) -> None:
        """Stop this node's jobs once no coordinator has been known to be there for
        fence_time, until cancelled."""
        limit = self.limit
        while True:
            await asyncio.sleep(min(FENCE_CHECK_MAX, limit / 10))
            if self.connected.is_set():
                self.fenced.clear()
                continue
            if time.monotonic() - self.last_contact < limit:
                continue
            reason = f"fenced: no word from the coordinator for {limit:g} s"
            for job_id in self.supervisors.running_jobs():
                if job_id in self.fenced:
                    continue
                self.fenced.add(job_id)
                log.warning("job %d: %s; stopping it", job_id, reason)
                await self.supervisors.stop(job_id, JobState.NODE_FAIL, reason, 0, FENCE_GRACE)
