"""Nodes as admins and time see them: drains and resumes (gpuq drain / gpuq resume) and the
heartbeat timeout that gives a silent node's jobs up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeEntry, NodeTable
from gpuq.coordinator.workload.job_endings import JobEndings
from gpuq.domain.limits import brief, check_text
from gpuq.domain.model import Drain, GpuUnit, NodeState
from gpuq.domain.policy import FENCE_MARGIN, silence_allowed
from gpuq.errors import InvalidInput, NotFound
from gpuq.store.api import StoreTx

log = logging.getLogger(__name__)

MAX_DRAIN_REASON = 500  # characters of an admin's drain reason


class NodeAdmin:
    def __init__(
        self,
        settings: CoordinatorSettings,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        endings: JobEndings,
        wake: Callable[[], None],
        clock: Callable[[], float],
        steady: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.endings = endings
        self.wake = wake
        self.clock = clock
        # silences are measured on this monotonic clock (NodeEntry.heard_at), never the wall
        # clock: a step of that must neither give a node up before its fence nor hold it forever
        self.steady = steady

    def drain_targets(self, node: str, gpu: str) -> tuple[NodeEntry, list[GpuUnit]]:
        """The node and the units `gpu` names there: an index as `gpuq nodes` shows it (every
        MIG slice of that GPU), a unit's UUID, or "" (the whole node: no units). NotFound
        for an unknown node or GPU."""
        entry = self.nodes.get(node)
        if entry is None:
            known = ", ".join(sorted(self.nodes.nodes)) or "none yet"
            raise NotFound(f"no node {brief(node)} (known nodes: {brief(known)})")
        if not gpu:
            return entry, []
        units = entry.node.units
        if gpu.isascii() and gpu.isdigit():
            found = [u for u in units if str(u.index) == gpu.lstrip("0").rjust(1, "0")]
        else:
            found = [u for u in units if u.uuid == gpu]
        if not found:
            indices = sorted({u.index for u in units})
            have = f"GPUs {', '.join(map(str, indices))}" if indices else "no GPUs"
            raise NotFound(
                f"node {node} has no GPU {brief(gpu)} (it has {have}; give an index as "
                "gpuq nodes shows it, or a GPU or MIG UUID)"
            )
        return entry, found

    async def drain(self, node: str, gpu: str, reason: str, user: str) -> tuple[list[str], str]:
        """An admin takes a node (gpu "") or a GPU out of service: no new work goes there,
        running jobs continue. Kept in the store until resume. (units drained, message)"""
        reason = " ".join(reason.split())
        if not reason:
            raise InvalidInput("--reason", "", "say why (it is shown in gpuq nodes)")
        check_text("--reason", reason, MAX_DRAIN_REASON)
        _, units = self.drain_targets(node, gpu)
        now = self.clock()
        drains = [Drain(node, u.uuid, reason, user, now) for u in units] or [
            Drain(node, "", reason, user, now)
        ]

        def write(tx: StoreTx) -> None:
            for drain in drains:
                tx.set_drain(drain)

        def remember(_: None = None) -> None:
            for drain in drains:
                self.nodes.drains[(drain.node, drain.unit)] = drain

        # the admin may retry; memory follows a write that lands after the answer, too
        await self.writer.write(write, fail_fast=True, on_late=remember)
        remember()
        what = _target_text(node, units)
        running = [
            j.id
            for j in self.jobs.running_on(node)
            if not units or set(j.gpus) & {u.uuid for u in units}
        ]
        log.warning("%s drained by %s: %s", what, user, reason)
        self.wake()  # pending reasons change
        message = f"{what} drained: {reason}"
        if running:
            jobs = ", ".join(map(str, running[:10])) + (", ..." if len(running) > 10 else "")
            message += f" (running jobs continue: {jobs})"
        return [u.uuid for u in units], message

    async def resume(self, node: str, gpu: str, user: str) -> tuple[list[str], str]:
        """Undo an admin's drain of a node or a GPU. A unit its agent reports unhealthy or
        dirty stays out of service, and the message says so."""
        entry, units = self.drain_targets(node, gpu)
        keys = [(node, u.uuid) for u in units] or [(node, "")]

        def write(tx: StoreTx) -> list[bool]:
            return [tx.clear_drain(n, u) for n, u in keys]

        def forget(_: object = None) -> None:
            for key in keys:
                self.nodes.drains.pop(key, None)

        cleared = await self.writer.write(write, fail_fast=True, on_late=forget)
        forget()
        what = _target_text(node, units)
        if any(cleared):
            log.warning("%s resumed by %s", what, user)
            message = f"{what} resumed"
        else:
            message = f"{what} was not drained"
        self.wake()
        return [u.uuid for u in units], "; ".join([message, *self._still_out(entry, units)])

    def _still_out(self, entry: NodeEntry, units: Sequence[GpuUnit]) -> list[str]:
        """What keeps units out of service after a resume: their agent's word, other drains."""
        notes: list[str] = []
        node = entry.node.name
        agent = entry.agent_health()
        for unit in units:
            if unit.uuid in agent:
                health, why = agent[unit.uuid]
                notes.append(f"{unit.label} stays {health.value} per its agent: {why}")
        if not units:
            still = [u for u in entry.node.units if (node, u.uuid) in self.nodes.drains]
            if still:
                labels = ", ".join(sorted({u.label for u in still}))
                notes.append(f"still drained: {labels} (gpuq resume {node}:{still[0].index})")
            if entry.drained:
                notes.append(f"its agent still takes no work: {entry.drained}")
        return notes

    async def check_heartbeats(self) -> None:
        """A chore: a node silent for the heartbeat timeout is given up (its jobs node_fail,
        requeued as their QOS allows), and never before its agent's fence has certainly
        stopped them (fence_wait): a job must not run on two nodes at once."""
        now = self.steady()
        settings = self.settings
        for name, entry in list(self.nodes.nodes.items()):
            timeout = silence_allowed(
                settings.heartbeat_timeout, entry.node.fence_time, settings.kill_grace
            )
            if entry.node.state is NodeState.DOWN or now - entry.heard_at <= timeout:
                continue
            if entry.session is not None:
                entry.session.close()
                entry.session = None
            await self.endings.node_lost(name, f"no word from its agent for {timeout:g} s")

    def out_of_touch(self, names: Sequence[str]) -> list[str]:
        """Those of `names` whose jobs their own supervisors may be fencing now: down, or
        silent for about their agent's fence_time (a part of a multi-node job that failed
        there failed because of that, not by itself)."""
        now = self.steady()
        lost = []
        for name in names:
            entry = self.nodes.get(name)
            if entry is None:
                continue
            fence = entry.node.fence_time
            silent = bool(fence) and now - entry.heard_at >= fence - FENCE_MARGIN
            if silent or entry.node.state is NodeState.DOWN:
                lost.append(name)
        return lost


def _target_text(node: str, units: Sequence[GpuUnit]) -> str:
    """`node a`, `node a GPU 1`, `node m GPU 0 slice 3g.40gb, GPU 0 slice 3g.40gb`."""
    if not units:
        return f"node {node}"
    return f"node {node} " + ", ".join(u.label for u in units)
