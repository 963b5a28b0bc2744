"""A coordinator's JobLaunch, step by step, to a running supervisor: the one place that orders a
launch on this node.

1. An earlier start of the job still ending here: the launch is handed back (below).
2. The order is read from the wire (launch_order) and its units checked: all of them this
   node's (else its GPUs changed since the coordinator chose them: handed back).
3. Who it runs as: its submitter's account here, if this node may run that user's jobs at all
   (gpuq.agent.jobs.job_account); a refusal ends the job failed, with the reason.
4. A share job gets its GPU's MPS daemon (started for its user if none runs) and its limits
   (gpuq.agent.jobs.mps_daemons); one that cannot have them here is handed back.
5. Its CPUs, near its GPUs, and its units are noted as held (gpuq.agent.gpu.node_gpus).
6. The launch spec (gpuq.agent.jobs.launch_spec.build_launch), which also keeps the units and a
   share's VRAM limit for an agent that adopts the job after a restart.
7. A supervisor runs it (gpuq.agent.jobs.supervisors); from then on its reports say the rest.

A launch this node cannot start (no fork server runs, an earlier start is still ending, its
GPUs changed) is handed back: reported NOT_STARTED after REFUSE_HOLD, which sends it back to the
queue as it was (it never ran: not a requeue, not preempted). The hold keeps a coordinator that
would send it straight back here from spinning; until then the job counts as running here. Any
other failure of a launch ends the job failed. Either way what a failed launch was given is
taken back (its units, CPUs and MPS share).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from gpuq.agent.end_reports import EndReports
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.agent.jobs.fork_server_link import LaunchRefused
from gpuq.agent.jobs.gang_environment import Gang
from gpuq.agent.jobs.job_account import (
    Account,
    coordinator_socket_owner,
    launch_refusal,
    lookup_account,
)
from gpuq.agent.jobs.job_cgroups import JobSubtree
from gpuq.agent.jobs.launch_spec import LaunchOrder, NodePolicy, build_launch
from gpuq.agent.jobs.mps_daemons import MpsDaemons, MpsError
from gpuq.agent.jobs.mps_share import MpsShare
from gpuq.agent.jobs.supervisor_reports import ReportKind, SupervisorReport
from gpuq.agent.jobs.supervisors import Supervisors
from gpuq.config.settings import AgentSettings, split_addresses
from gpuq.convert import spec_from_proto
from gpuq.domain.states import JobState
from gpuq.steps import shim_dir
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

# README "GPUs: health, isolation": root holds every MIG capability and may leave its cgroup
ROOT_ON_MIG = "GPU isolation partial: it ran as root on a MIG slice, not kept off its siblings"
log = logging.getLogger(__name__)
MAX_CPUS = 1 << 16  # more than any node has: "every CPU"
# a launch this node cannot start (its fork server is down) is reported this much later, so that
# a coordinator that sends it straight back here does not spin
REFUSE_HOLD = 5.0


class Launcher:
    """`address`: the coordinator's (one or several, comma-separated), whose Unix socket's owner
    decides whose jobs a root agent may run (root or `service_uid`: everyone's). `cgroup_key`:
    the installation's level of job cgroups. `policy` is this node's side of every launch;
    node_changed() makes it anew."""

    def __init__(
        self,
        supervisors: Supervisors,
        gpus: NodeGpus,
        mps: MpsDaemons,
        reports: EndReports,
        *,
        settings: AgentSettings,
        address: str,
        cgroup_key: str,
        job_subtree: JobSubtree | None = None,
        service_uid: int | None = None,
    ) -> None:
        self.supervisors = supervisors
        self.gpus = gpus
        self.mps = mps
        self.reports = reports
        self.settings = settings
        self.address = address
        self.service_uid = service_uid  # the coordinator's service user: its socket is shared
        self.cgroup_key = cgroup_key
        self.job_subtree = job_subtree
        self.policy = self.node_policy()
        self.held: dict[int, asyncio.TimerHandle] = {}  # not started, to be handed back
        self.held_attempts: dict[int, int] = {}  # their attempts

    def node_policy(self) -> NodePolicy:
        """This node's side of a launch: its units and what the admin configured."""
        extra: dict[str, str] = {}
        state_dir = getattr(self.gpus.backend, "state_dir", None)
        if self.gpus.inventory.fake and state_dir is not None:
            extra["GPUQ_FAKE_GPU_DIR"] = str(state_dir)
        s = self.settings
        return NodePolicy(
            node=s.node_name,
            units=dict(self.gpus.units),
            visible_devices="index" if s.visible_devices == "index" else "uuid",
            job_env=dict(s.job_env),
            mem_enforcement=s.mem_enforcement,  # type: ignore[arg-type]
            cgroup_parent=s.cgroup_parent,
            cgroup_key=self.cgroup_key,
            cgroup_delegated=self.job_subtree.relative() if self.job_subtree else None,
            job_max_pids=s.job_max_pids,
            extra_env=extra,
            devices=dict(self.gpus.device_numbers),
            switch_user=os.geteuid() == 0,  # a job runs as its submitter (the supervisor)
            python=sys.executable,
            shim_dir=shim_dir() if s.slurm_shims else "",
            coordinator=s.job_coordinator or unix_only(self.address),
            max_output=s.max_output,
        )

    def node_changed(self) -> None:
        """The node's units changed (a MIG change, a GPU reset)."""
        self.policy = self.node_policy()

    # ---- the launch ------------------------------------------------------------------------

    async def launch(self, launch: apb.JobLaunch) -> None:
        """Start the job `launch` names, in the module's steps; every outcome is reported."""
        job_id, attempt = launch.job_id, launch.attempt
        if job_id in self.supervisors.running_jobs() or job_id in self.reports.unacked:
            # an earlier start of the job is still ending here (it was stopped as a stray)
            self.hand_back(job_id, "an earlier start of the job is ending", attempt)
            return
        try:
            order = launch_order(launch)
            unknown = [uuid for uuid in order.gpus if uuid not in self.gpus.units]
            if unknown:
                raise LaunchRefused(f"it has no GPU {unknown[0]} (its GPUs changed)")
            account = lookup_account(order.user)
            refusal = self._refusal(order, account)
            if refusal is not None:
                log.error("job %d not started: %s", job_id, refusal)
                self._fail(job_id, refusal, attempt)
                return
            if account is not None and account.uid == 0 and self._on_mig(order.gpus):
                log.warning("job %d: %s", job_id, ROOT_ON_MIG)
                self.gpus.xids.job_notes.setdefault(job_id, []).append(ROOT_ON_MIG)
            mps = await self._share(order, launch.spec.resources, account)
            res = order.spec.resources
            # an --exclusive job has the whole node: every CPU, so it is bound to none
            cpus = self.gpus.place(job_id, order.gpus, MAX_CPUS if res.exclusive else res.cpus)
            if self.job_subtree is not None:
                self.job_subtree.relative()  # prepared again if its unit restarted
            spec = build_launch(order, self.policy, cpus=cpus, account=account, mps=mps)
            if mps is not None:
                self.gpus.holders.set_share(job_id, mps.mem_limit)
            await self.supervisors.launch(spec)
        except LaunchRefused as error:
            self._take_back(job_id)
            log.error("job %d not started: %s", job_id, error)
            self.hand_back(job_id, str(error), attempt)
        except Exception as error:  # a launch that cannot even begin ends the job as failed
            self._take_back(job_id)
            log.exception("cannot launch job %d", job_id)
            self._fail(job_id, f"launch failed on {self.policy.node}: {error}", attempt)

    def _on_mig(self, gpus: tuple[str, ...]) -> bool:
        return any(self.gpus.units[uuid].parent_uuid for uuid in gpus if uuid in self.gpus.units)

    def _refusal(self, order: LaunchOrder, account: Account | None) -> str | None:
        """Why this node must not run the job's user's jobs (None: it may)."""
        return launch_refusal(
            order.user,
            account,
            node=self.policy.node,
            agent_uid=os.geteuid(),
            allow_root_jobs=self.settings.allow_root_jobs,
            coordinator_owner=coordinator_socket_owner(
                split_addresses(self.address), self.service_uid
            ),
        )

    async def _share(
        self, order: LaunchOrder, resources: pb.Resources, account: Account | None
    ) -> MpsShare | None:
        """A share job's MPS daemon (started for its user if none runs on its GPU) and
        limits; None for any other job. LaunchRefused when it cannot have one here."""
        share = order.spec.resources.gpu_share or resources.gpu_share
        if not share:
            return None
        unit = self.gpus.units.get(order.gpus[0]) if len(order.gpus) == 1 else None
        if unit is None or not unit.shared:
            raise LaunchRefused(
                f"a GPU share needs one GPU listed in [agent] shared_gpus, not {order.gpus}"
            )
        mem_limit = order.spec.resources.gpu_mem or resources.gpu_mem
        if not mem_limit:
            raise LaunchRefused("a GPU share needs its VRAM limit (--gpu-mem)")
        if self.policy.switch_user and account is not None:
            uid, gid = account.uid, account.gid
        else:
            uid, gid = os.geteuid(), os.getegid()
        try:
            return await self.mps.acquire(
                order.job_id, unit.uuid, uid, gid, percent=int(share), mem_limit=mem_limit
            )
        except MpsError as error:
            raise LaunchRefused(str(error)) from error

    def _take_back(self, job_id: int) -> None:
        """What a launch that failed was given: its units, CPUs and MPS share."""
        self.gpus.holders.launch_failed(job_id)
        self.mps.release(job_id)

    def _fail(self, job_id: int, reason: str, attempt: int) -> None:
        self.reports.on_report(
            SupervisorReport(
                job_id, ReportKind.ENDED, JobState.FAILED, reason=reason, attempt=attempt
            )
        )

    def adopt_shares(self) -> None:
        """Share jobs an earlier agent started keep their GPU's daemon, which this agent
        takes over; a daemon no running share job uses is stopped."""
        self.mps.recover()
        for job_id in self.supervisors.running_jobs():
            spec = self.supervisors.launch_spec_of(job_id)
            if spec is not None and spec.share_mem and spec.gpus:
                self.mps.adopt(job_id, spec.gpus[0])
        self.mps.stop_idle()

    # ---- launches handed back --------------------------------------------------------------

    def hand_back(self, job_id: int, problem: str, attempt: int = 0) -> None:
        """The job did not start here: after REFUSE_HOLD, report it NOT_STARTED."""

        def report() -> None:
            if self.held.pop(job_id, None) is not None:
                self.held_attempts.pop(job_id, None)
                reason = f"not started: {self.policy.node} cannot start jobs ({problem})"
                self.reports.on_report(
                    SupervisorReport(
                        job_id, ReportKind.NOT_STARTED, None, reason=reason, attempt=attempt
                    )
                )

        if job_id not in self.held:
            self.held[job_id] = asyncio.get_running_loop().call_later(REFUSE_HOLD, report)
            self.held_attempts[job_id] = attempt

    def release_held(self, job_id: int) -> bool:
        """A stop came for a job held to be handed back (it never started: it ends as the
        stop says instead); False when the job is not held."""
        held = self.held.pop(job_id, None)
        if held is None:
            return False
        held.cancel()
        self.held_attempts.pop(job_id, None)
        return True

    def held_jobs(self) -> list[apb.JobReport]:
        """The jobs held before they go back to the queue: to the coordinator they still run
        here (for a registration)."""
        return [
            apb.JobReport(
                job_id=job_id, kind=apb.JobReport.RUNNING, attempt=self.held_attempts.get(job_id, 0)
            )
            for job_id in self.held
        ]


def unix_only(address: str) -> str:
    """The agent's coordinator address for jobs, when it is Unix sockets only (which users
    on this machine may use as well); "" for TCP (a user needs a token: their own config)."""
    parts = split_addresses(address)
    return address if parts and all(p.startswith("unix:") for p in parts) else ""


def launch_order(launch: apb.JobLaunch) -> LaunchOrder:
    """The coordinator's JobLaunch, as the launch spec is built from it."""
    return LaunchOrder(
        job_id=launch.job_id,
        spec=spec_from_proto(launch.spec),
        gpus=tuple(launch.gpus),
        user=launch.user,
        time_limit=launch.time_limit or None,
        kill_grace=launch.kill_grace,
        array_job_id=launch.array_job_id if launch.HasField("array_job_id") else None,
        array_task_id=launch.array_task_id if launch.HasField("array_task_id") else None,
        requeue_count=launch.requeue_count,
        attempt=launch.attempt,
        max_output=launch.max_output or None,
        gang=Gang(
            nodes=tuple(launch.nodes),
            addresses=tuple(launch.node_addrs),
            index=launch.node_index,
            master_port=launch.master_port,
            step_key=launch.step_key,
        )
        if launch.nodes
        else None,
    )
