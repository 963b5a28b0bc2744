"""The coordinator's event bus: what happened, told to whoever subscribed.

Three channels, each a plain list of callbacks, subscribed once when the coordinator is put
together (gpuq.coordinator.server.assemble, which says who listens to what):

- job events: every event a change makes (submitted, started, ended, held, updated...), after
  memory took the change, with the job (see JobChanges for which version of it). Watch
  streams, notifications, interactive terminals and metrics listen here.
- scheduling passes: how long each took.
- store commits: how long each group commit took.

Callbacks run on the event loop, in the change's own step, and must not block. One that
raises is logged and the others still run: a listener never stands in the way of a change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuq.domain.model import Job, JobEvent

log = logging.getLogger(__name__)

JobListener = Callable[[JobEvent, Job | None], None]
DurationListener = Callable[[float], None]


class EventBus:
    def __init__(self) -> None:
        self._job_listeners: list[JobListener] = []
        self._pass_listeners: list[DurationListener] = []
        self._commit_listeners: list[DurationListener] = []

    def on_job_event(self, listener: JobListener) -> None:
        self._job_listeners.append(listener)

    def on_pass(self, listener: DurationListener) -> None:
        self._pass_listeners.append(listener)

    def on_commit(self, listener: DurationListener) -> None:
        self._commit_listeners.append(listener)

    def job_event(self, event: JobEvent, job: Job | None) -> None:
        for listener in self._job_listeners:
            try:
                listener(event, job)
            except Exception:
                log.exception("a listener failed on job %d's event", event.job_id)

    def pass_ran(self, seconds: float) -> None:
        self._tell(self._pass_listeners, seconds, "a scheduling pass")

    def committed(self, seconds: float) -> None:
        self._tell(self._commit_listeners, seconds, "a store commit")

    @staticmethod
    def _tell(listeners: list[DurationListener], seconds: float, what: str) -> None:
        for listener in listeners:
            try:
                listener(seconds)
            except Exception:
                log.exception("a listener failed on %s", what)
