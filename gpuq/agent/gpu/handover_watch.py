"""Whether each unit can be handed to the next job: a clean hand-over and foreign processes.

A unit goes back to the queue only when NVML lists no process on it any more. When a job
ends, its supervisor has already killed everything in the job's cgroup; what NVML may still
list then is a process that would not die (stuck in the driver, or outside the job's reach),
a context the driver has not torn down yet, or someone else's process. Until the list is
empty the unit is "dirty" (not given out) with a reason naming the process. After
handover_timeout the job's own stragglers are killed; a process that belongs to no job is
"foreign": flagged, and killed only when the admin's policy says so. A foreign graphics
context (a display server on a workstation's GPU) is only flagged: it neither keeps jobs off
the unit nor is killed. A foreign process in a container runtime's cgroup (docker, containerd,
CRI-O: a container a job may have started through the runtime's daemon, outside the job's
cgroup) is flagged as a container process and keeps a free unit dirty, but is never killed:
it may be a job's own work, and its runtime, not gpuq, owns it.

UnitWatch decides; the agent does the I/O (NVML reads, /proc lookups, kills) around it, so
the rules are tested with plain data and a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.agent.gpu.backend import HEALTH_DIRTY, HEALTH_OK, GpuProcess, UnitUsage
from gpuq.domain.units import format_size

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class UnitVerdict:
    """What the agent says about one unit in its heartbeat."""

    health: str  # ok, unhealthy (the backend's), dirty
    reason: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Assessment:
    verdicts: dict[str, UnitVerdict]
    kill: tuple[int, ...] = ()  # pids to SIGKILL now
    flagged: tuple[str, ...] = ()  # new foreign-process findings, for the log


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """What the agent looked up about the processes NVML listed (pid -> fact)."""

    owner: Mapping[int, int | None]  # the job whose cgroup holds the pid, None: no job's
    alive: Mapping[int, bool]
    name: Mapping[int, str]
    # pid -> "docker container 3f2a..." for a process of no job in a container runtime's group
    container: Mapping[int, str] = field(default_factory=dict)


@dataclass(slots=True)
class UnitWatch:
    handover_timeout: float
    kill_foreign: bool = False
    clock: Clock = time.monotonic
    # unit uuid -> (the job that last held it, when it ended): units being handed over
    _handover: dict[str, tuple[int, float]] = field(default_factory=dict)
    _flagged: set[tuple[str, int]] = field(default_factory=set)

    def job_ended(self, job_id: int, units: Sequence[str]) -> None:
        now = self.clock()
        for uuid in units:
            self._handover[uuid] = (job_id, now)

    def handing_over(self, uuid: str) -> int | None:
        """The job whose end is being checked on this unit, or None."""
        entry = self._handover.get(uuid)
        return entry[0] if entry else None

    def assess(
        self,
        usage: Sequence[UnitUsage],
        holders: Mapping[str, int],
        facts: ProcessFacts,
        partial: bool = False,
    ) -> Assessment:
        """Every unit's verdict; holders: unit uuid -> the running job that holds it.
        `partial`: `usage` has only some units (the others' findings stay as they were)."""
        verdicts: dict[str, UnitVerdict] = {}
        kill: list[int] = []
        flagged: list[str] = []
        seen: set[tuple[str, int]] = set()
        for unit in usage:
            holder = holders.get(unit.uuid)
            if holder is not None:
                self._handover.pop(unit.uuid, None)
                verdict, unit_kill = self._held(unit, holder, facts)
            else:
                verdict, unit_kill = self._free(unit, facts)
            kill.extend(unit_kill)
            for process in unit.processes:
                owner = facts.owner.get(process.pid)
                if owner is None or owner != holder:
                    key = (unit.uuid, process.pid)
                    seen.add(key)
                    if key not in self._flagged and verdict.notes:
                        flagged.append(f"{unit.uuid}: {verdict.notes[0]}")
            if unit.health != HEALTH_OK:  # the backend's word wins; notes are kept
                verdict = UnitVerdict(unit.health, unit.reason, verdict.notes)
            verdicts[unit.uuid] = verdict
        if partial:
            assessed = {unit.uuid for unit in usage}
            seen |= {key for key in self._flagged if key[0] not in assessed}
        self._flagged = seen
        return Assessment(verdicts, tuple(sorted(set(kill))), tuple(flagged))

    def _held(
        self, unit: UnitUsage, holder: int, facts: ProcessFacts
    ) -> tuple[UnitVerdict, list[int]]:
        notes: list[str] = []
        kill: list[int] = []
        for process in unit.processes:
            owner = facts.owner.get(process.pid)
            if owner == holder or not facts.alive.get(process.pid, False):
                continue
            notes.append(f"{_whose(owner, process, facts)} on job {holder}'s unit")
            if self._killable(owner, process, facts) and process.kind != "graphics":
                kill.append(process.pid)
        return UnitVerdict(HEALTH_OK, "", tuple(notes)), kill

    def _free(self, unit: UnitUsage, facts: ProcessFacts) -> tuple[UnitVerdict, list[int]]:
        if not unit.processes:
            self._handover.pop(unit.uuid, None)
            return UnitVerdict(HEALTH_OK), []
        ended = self._handover.get(unit.uuid)
        overdue = ended is not None and self.clock() - ended[1] >= self.handover_timeout
        reasons: list[str] = []
        notes: list[str] = []
        kill: list[int] = []
        for process in unit.processes:
            owner = facts.owner.get(process.pid)
            described = _describe(process, facts)
            if not facts.alive.get(process.pid, False):
                reasons.append(f"pid {process.pid} has exited but NVML still lists it")
            elif ended is not None and owner == ended[0]:
                reasons.append(f"{described} of job {ended[0]} is still running")
                if overdue:
                    kill.append(process.pid)
            elif ended is not None and owner is None and not overdue:
                reasons.append(f"{described} is still listed after job {ended[0]} ended")
            elif owner is None and process.kind == "graphics":
                # a display server's context (Xorg, a desktop) on a workstation's GPU: shown,
                # but it neither keeps jobs off the GPU nor is ever killed
                notes.append(f"foreign process {described} on a free unit")
            else:
                whose = _whose(owner, process, facts)
                reasons.append(f"{whose} holds it")
                notes.append(f"{whose} on a free unit")
                if self._killable(owner, process, facts):
                    kill.append(process.pid)
        if not reasons:
            return UnitVerdict(HEALTH_OK, "", tuple(notes)), kill
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        return UnitVerdict(HEALTH_DIRTY, reasons[0] + more, tuple(notes)), kill

    def _killable(self, owner: int | None, process: GpuProcess, facts: ProcessFacts) -> bool:
        """A foreign process is killed under foreign_processes = "kill", a container's never."""
        return owner is None and self.kill_foreign and not facts.container.get(process.pid)


def _whose(owner: int | None, process: GpuProcess, facts: ProcessFacts) -> str:
    """ "job 7's process pid 42 (...)", "foreign process ...", or "container process pid 42
    (..., docker container 3f2a...) (never killed)" for one in a container runtime's group."""
    if owner is not None:
        return f"job {owner}'s process {_describe(process, facts)}"
    container = facts.container.get(process.pid)
    if container:
        return f"container process {_describe(process, facts, container)} (never killed)"
    return f"foreign process {_describe(process, facts)}"


def _describe(process: GpuProcess, facts: ProcessFacts, where: str = "") -> str:
    name = facts.name.get(process.pid, "?")
    held = f", {format_size(process.used)}" if process.used else ""
    kind = "" if process.kind == "compute" else f", {process.kind}"
    place = f", {where}" if where else ""
    return f"pid {process.pid} ({name}{held}{kind}{place})"
