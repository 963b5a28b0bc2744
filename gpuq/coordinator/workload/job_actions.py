"""Users' actions on their jobs: cancel, hold, release, requeue, update (SLURM's scancel,
scontrol hold/release/requeue/update).

One request is one batch: the selected jobs are resolved first (gpuq.coordinator.workload.
selection), checked (a user may act on their own jobs only; an admin on any, logged; one job
of another user's in the request refuses all of it, before anything changes), then changed in
one store transaction, then one scheduling pass follows.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.access.permissions import check_acts_on, check_selected, check_selects_for
from gpuq.coordinator.changes.effects import Cause, Effects, Move
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.changes.transitions import (
    Answer,
    decide_cancel,
    decide_requeue,
    decide_state_change,
)
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.coordinator.workload.selection import Selection, SelectionResolver
from gpuq.coordinator.workload.update_rules import (
    Edit,
    Update,
    check_requeue,
    dependency_cycle,
    plan_update,
)
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.errors import (
    GpuqError,
    InvalidInput,
    PermissionDenied,
    StorageUnavailable,
    Unsatisfiable,
    error_kind,
)
from gpuq.identity import Caller
from gpuq.scheduler.fitting import never_fits, never_fits_reason
from gpuq.store.records import JobEdit

log = logging.getLogger(__name__)

LIVE = frozenset({JobState.PENDING, JobState.HELD, JobState.RUNNING})
LOGGED_JOBS = 20  # an admin's action on others' jobs: logged one line per job up to this

Action = Callable[[list[Job]], Awaitable[list[Answer]]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action (cancel, hold, release, requeue, update) did to one job. `message`
    does not name the job: every reader puts `job_id` before it ("job 33: held")."""

    job_id: str
    done: bool
    message: str
    kind: str = ""  # a failure's error kind (gpuq.errors.ERROR_KINDS): "not_found", ...


def failed(job_id: str, error: BaseException, kind: str = "") -> Outcome:
    """A failed outcome from an error whose text may name the job already ("job 33: cannot
    go from held to held", "job 33 belongs to bob"): named once, by the outcome's job_id;
    with the error's kind, so that a client raises what a single call would have."""
    text = str(error)
    for named in (f"job {job_id}: ", f"job {job_id} "):
        if text.startswith(named):
            text = text[len(named) :]
            break
    if not kind and isinstance(error, GpuqError):
        kind = error_kind(error)
    return Outcome(job_id, False, text, kind)


class JobActions:
    def __init__(
        self,
        settings: CoordinatorSettings,
        jobs: LiveJobs,
        nodes: NodeTable,
        arrays: ArrayTasks,
        selections: SelectionResolver,
        changes: JobChanges,
        wake: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.nodes = nodes
        self.arrays = arrays
        self.selections = selections
        self.changes = changes
        self.wake = wake

    async def cancel(
        self, selection: Selection, caller: Caller, cause: Cause, reason: str = ""
    ) -> list[Outcome]:
        why = reason or f"cancelled by {caller.user}"
        grace = self.settings.kill_grace

        async def action(jobs: list[Job]) -> list[Answer]:
            return await self._commit(jobs, cause, lambda s: decide_cancel(jobs, s, why, grace))

        return await self._act("cancelled", selection, caller, cause, action, LIVE)

    async def hold(self, selection: Selection, caller: Caller, cause: Cause) -> list[Outcome]:
        return await self._state_change(selection, caller, cause, JobState.HELD, "held")

    async def release(self, selection: Selection, caller: Caller, cause: Cause) -> list[Outcome]:
        return await self._state_change(selection, caller, cause, JobState.PENDING, "released")

    async def _state_change(
        self, selection: Selection, caller: Caller, cause: Cause, to: JobState, verb: str
    ) -> list[Outcome]:
        why = f"{verb} by {caller.user}"

        async def action(jobs: list[Job]) -> list[Answer]:
            return await self._commit(jobs, cause, lambda s: decide_state_change(jobs, s, to, why))

        applies_to = frozenset({JobState.HELD if to is JobState.PENDING else JobState.PENDING})
        return await self._act(verb, selection, caller, cause, action, applies_to)

    async def _commit(
        self,
        jobs: list[Job],
        cause: Cause,
        decide: Callable[[Mapping[int, JobState]], tuple[Effects, list[Answer]]],
    ) -> list[Answer]:
        """One transaction: the jobs' states as stored decide (the user may retry a store
        outage: fail fast)."""
        ids = [j.id for j in jobs]
        return await self.changes.commit(
            lambda tx, now: decide(tx.job_states(ids)), cause, fail_fast=True
        )

    async def requeue(
        self, selection: Selection, caller: Caller, cause: Cause, *, hold: bool = False
    ) -> list[Outcome]:
        """`gpuq requeue` (SLURM's scontrol requeue): running jobs are stopped as a
        preemption stops them and go back to the queue with the same id; ended jobs are
        queued again at once; `hold`: held instead of pending. Jobs submitted with
        --no-requeue are refused, as SLURM refuses them."""
        reason = f"requeued by {caller.user}" + (" (held)" if hold else "")
        grace = self.settings.kill_grace

        async def action(jobs: list[Job]) -> list[Answer]:
            answers: list[Answer] = []
            running: list[Job] = []
            ended: list[Job] = []
            for job in jobs:
                try:
                    check_requeue(job)
                except GpuqError as exc:
                    answers.append(exc)
                    continue
                (running if job.state is JobState.RUNNING else ended).append(job)
                answers.append("")
            ids = [j.id for j in running + ended]
            done = await self.changes.commit(
                lambda tx, now: decide_requeue(
                    running, ended, tx.job_states(ids), reason, hold, grace
                ),
                cause,
                fail_fast=True,
            )
            return [a if a != "" else done[j.id] for j, a in zip(jobs, answers, strict=True)]

        return await self._act(
            "requeued", selection, caller, cause, action, frozenset({JobState.RUNNING})
        )

    async def update(
        self, selection: Selection, changes: Update, caller: Caller, cause: Cause
    ) -> list[Outcome]:
        """`gpuq update`: change waiting jobs (gpuq.coordinator.workload.update_rules has the
        rules). Each job's change is decided first; one refused change (another's job, an
        owner raising a limit) refuses the request as a whole, before anything changes."""
        if not changes:
            raise InvalidInput("update", "nothing", "say what to change, e.g. --time 1:00:00")
        if not selection.ids:
            raise InvalidInput("job ids", "none", "name the jobs to update")

        async def action(jobs: list[Job]) -> list[Answer]:
            return await self._update_many(jobs, changes, caller, cause)

        return await self._act("updated", selection, caller, cause, action, LIVE)

    async def _update_many(
        self, jobs: list[Job], changes: Update, caller: Caller, cause: Cause
    ) -> list[Answer]:
        edits: list[Edit] = []
        results: list[Answer | Edit] = []
        for job in jobs:
            try:
                edit = plan_update(job, changes, caller.user, caller.admin, self.settings.qos)
            except PermissionDenied:
                raise  # an owner asked for what only admins may: nothing changes
            except GpuqError as exc:
                results.append(exc)
                continue
            edits.append(edit)
            results.append(edit)
        await self._check_edits(edits, changes, caller)
        written = [e for e in edits if e.changes or e.to_state is not None]
        if written:
            await self.changes.commit(
                lambda tx, now: (update_effects(written, caller.user), None),
                cause,
                fail_fast=True,  # the user may retry
            )
        out: list[Answer] = []
        for result in results:
            if not isinstance(result, Edit):
                out.append(result)
                continue
            words = list(result.changes)
            if result.to_state is not None and result.job.id in self.jobs.jobs:
                words.append("held" if result.to_state is JobState.HELD else "released")
            out.append("updated: " + "; ".join(words) if words else "unchanged")
        return out

    async def _check_edits(self, edits: Sequence[Edit], changes: Update, caller: Caller) -> None:
        """What the request as a whole must pass: dependencies that exist and make no cycle,
        room in a QOS moved to, and a spec that can run somewhere."""
        if changes.set_dependencies and edits:
            missing = await self.arrays.load_dependencies(changes.dependencies)
            if missing:
                raise InvalidInput("--after", missing[0], "no such job or array task")
            waits_on = {
                j.id: [d.job_id for d in j.spec.dependencies] for j in self.jobs.jobs.values()
            }
            for edit in edits:
                looped = dependency_cycle(edit.job.id, changes.dependencies, waits_on)
                if looped is not None:
                    raise InvalidInput(
                        "--after",
                        str(looped),
                        f"it waits for job {edit.job.display_id} (a cycle never starts)",
                    )
        if not caller.admin:
            self._check_qos_room(edits)
        if edits:
            views = self.nodes.views(self.jobs.in_state(JobState.RUNNING))
            for edit in edits:
                if views and all(
                    never_fits(v, edit.spec.resources, edit.spec.placement) for v in views
                ):
                    raise Unsatisfiable(
                        f"job {edit.job.display_id}: "
                        + never_fits_reason(views, edit.spec.resources, edit.spec.placement)
                    )

    def _check_qos_room(self, edits: Sequence[Edit]) -> None:
        """A QOS's max_submitted_jobs binds owners who move jobs into it, as at submit."""
        moving: Counter[tuple[str, str]] = Counter()
        for edit in edits:
            if edit.qos != edit.job.qos:
                moving[(edit.job.user, edit.qos)] += len(edit.job.tasks) or 1
        for (owner, qos), adding in moving.items():
            most = self.settings.qos[qos].max_submitted_jobs
            if most is None:
                continue
            mine = sum(
                len(j.tasks) or 1
                for j in self.jobs.jobs.values()
                if j.user == owner and j.qos == qos
            )
            if mine + adding > most:
                raise Unsatisfiable(
                    f"qos {qos} allows {most} queued or running jobs per user; {owner} has "
                    f"{mine} and this adds {adding}"
                )

    async def _act(
        self,
        verb: str,
        selection: Selection,
        caller: Caller,
        cause: Cause,
        action: Action,
        applies_to: frozenset[JobState],
    ) -> list[Outcome]:
        """Act on the selected jobs (see the module docstring); by filters and no ids, on the
        live jobs the verb applies to (`applies_to`)."""
        if selection.filters is not None:
            check_selects_for(caller, selection.filters.user)
        for named, owner in (await self.selections.owners(selection)).items():
            check_acts_on(caller, owner, named)
        outcomes: list[Outcome] = []
        async with self.arrays.splitting:  # no task leaves an array between select and action
            jobs, unselected = await self.selections.resolve(selection, caller, applies_to, cause)
            outcomes += [failed(u.named, u.why) for u in unselected]
            for job in jobs:
                check_selected(caller, job.user, job.display_id)
            self._log_admin(verb, caller, jobs)
            try:
                results = await action(jobs) if jobs else []
            except StorageUnavailable:  # the whole call fails (UNAVAILABLE): the user retries
                self.wake()
                raise
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, BaseException):
                outcomes.append(failed(job.display_id, result))
            else:
                outcomes.append(Outcome(job.display_id, True, result))
        self.wake()
        return outcomes

    @staticmethod
    def _log_admin(verb: str, caller: Caller, jobs: Sequence[Job]) -> None:
        others = [j for j in jobs if j.user != caller.user]
        for job in others[:LOGGED_JOBS]:
            log.warning("admin %s %s job %s of %s", caller.user, verb, job.display_id, job.user)
        if len(others) > LOGGED_JOBS:
            log.warning(
                "admin %s %s %d more jobs of other users",
                caller.user,
                verb,
                len(others) - LOGGED_JOBS,
            )


def update_effects(edits: Sequence[Edit], user: str) -> Effects:
    """An update's effects: each job's new spec (one event saying what changed), then its
    hold or release."""
    effects = Effects()
    for e in edits:
        if e.changes:
            why = f"updated by {user}: " + "; ".join(e.changes)
            effects.edits.append(JobEdit(e.job.id, e.spec, e.qos, e.priority, why))
    for e in edits:
        if e.to_state is not None:
            verb = "held" if e.to_state is JobState.HELD else "released"
            effects.moves.append(Move(e.job.id, e.job.state, e.to_state, f"{verb} by {user}"))
    return effects
