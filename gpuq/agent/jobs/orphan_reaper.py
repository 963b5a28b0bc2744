"""A job whose supervisor died before it ended: stop what is left of it, then say so.

Nothing a job started outlives it: when a supervisor dies without a result (even by SIGKILL),
the agent stops the job's process group and cgroups (recorded in the folder's job.pid) itself,
SIGTERM first and SIGKILL after the job's kill grace (as a stop would: a job may save its work),
and only then reports the end (failed, with what it found), so that its GPUs are freed only
when nothing of it is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from gpuq.agent.jobs import process_tree
from gpuq.agent.jobs.fork_server_link import ForkServerLink
from gpuq.agent.jobs.job_folder import (
    JOB_PID_FILE,
    RESULT_FILE,
    SPEC_FILE,
    Message,
    read_json_durable,
    write_json_atomic,
)

log = logging.getLogger(__name__)
ORPHAN_POLL = 0.05  # seconds between looks at a dead supervisor's job while stopping it
ORPHAN_GIVE_UP = 10.0  # seconds after SIGKILL to stop waiting for a job's processes to go
EXIT_WAIT = 0.5  # seconds to wait for the fork server's word on how a supervisor died


async def orphan_result(
    job_dir: Path, job_id: int, supervisor_pid: int | None, forks: ForkServerLink
) -> Message:
    """Stop the processes of a job whose supervisor is gone; the result that says so, also
    left in the folder's result.json (for an agent that restarts before the end is acked)."""
    try:
        stopped = await asyncio.to_thread(stop_job_processes, job_dir, job_id)
        if supervisor_pid is not None and forks.ready.is_set():
            # how it died comes from the fork server (its parent), perhaps a moment later;
            # a supervisor of an earlier fork server has another parent: no word comes
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(forks.exit_told(supervisor_pid), EXIT_WAIT)
    except Exception as error:  # never leave the job unreported
        log.exception("stopping the processes of job %d", job_id)
        reason = f"supervisor lost before the job ended; stopping its processes failed: {error}"
    else:
        left = f"{_count(stopped)} stopped" if stopped else "no process of it was left"
        reason = f"supervisor lost before the job ended{forks.how_it_died(supervisor_pid)}; {left}"
    log.warning("job %d: %s", job_id, reason)
    now = time.time()
    result: Message = {"job_id": job_id, "end_state": "failed", "exit_code": None}
    result.update(signal=None, started_at=now, ended_at=now, peak_mem=0)
    result.update(leftovers_killed=0, reason=reason)
    with contextlib.suppress(OSError):
        write_json_atomic(job_dir / RESULT_FILE, result)
    return result


def _count(processes: int) -> str:
    return f"its {processes} processes were" if processes != 1 else "its process was"


def stop_job_processes(job_dir: Path, job_id: int) -> int:
    """Stop every process of a job whose supervisor is gone; how many it had when this began.

    Found by job.pid (the process group and cgroups the supervisor recorded) and by the job's
    environment (GPUQ_JOB_ID and GPUQ_NODE, for processes that left the group of a job without
    a cgroup). Blocking: run it in a thread."""
    spec = read_json_durable(job_dir / SPEC_FILE) or {}
    env = spec.get("env") or {}
    grace = float(spec.get("kill_grace") or 0.0)
    pgid, cgroups = None, []
    try:
        head, _, tail = (job_dir / JOB_PID_FILE).read_text().partition("\n")
        # one folder a line: the job's groups in each cgroup hierarchy (memory first)
        cgroups = [line.strip() for line in tail.splitlines() if line.strip()]
        # "<pid> <start time> <how it was made>" (older supervisors: no third word)
        pid_text, start_text = head.split()[:2]
        pgid = int(pid_text)
        if pgid <= 1 or not _group_is_the_jobs(pgid, int(start_text)):
            pgid = None
    except (OSError, ValueError):
        pass
    # the environment is what a job says of itself (any process may set GPUQ_JOB_ID): it
    # finds the job's processes only where no cgroup holds them
    marker = (
        (str(env["GPUQ_JOB_ID"]), str(env["GPUQ_NODE"]))
        if "GPUQ_NODE" in env and not cgroups
        else None
    )
    count: int | None = None
    termed: set[int] = set()  # SIGTERM goes once to each: a job's trap must not run again
    term_until = time.monotonic() + grace
    give_up = term_until + ORPHAN_GIVE_UP
    while True:
        pids = _processes_of_job(pgid, cgroups, marker)
        if count is None:
            count = len(pids)
        if not pids:
            for cgroup in cgroups:
                _remove_cgroup(cgroup)
            return count
        killing = time.monotonic() >= term_until
        sig = signal.SIGKILL if killing else signal.SIGTERM
        if pgid is not None and (killing or not termed):
            with contextlib.suppress(OSError):
                os.killpg(pgid, sig)
        for pid in pids if killing else pids - termed:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        termed |= pids
        if time.monotonic() > give_up:
            log.error("job %d: processes %s outlive SIGKILL", job_id, sorted(pids))
            return count
        time.sleep(ORPHAN_POLL)


def _processes_of_job(
    pgid: int | None, cgroups: list[str], marker: tuple[str, str] | None
) -> set[int]:
    """The job's live processes: by its process group, marker and first cgroup (which holds
    the whole job), plus any member of its other groups (a process that joined only one)."""
    pids = process_tree.processes_of_job(pgid, cgroups[0] if cgroups else None, marker)
    for cgroup in cgroups[1:]:
        with contextlib.suppress(OSError, ValueError):
            members = process_tree.read_proc(f"{cgroup}/cgroup.procs").split()
            pids.update(pid for pid in map(int, members) if not process_tree.has_exited(pid))
    pids.discard(os.getpid())
    return pids


def _remove_cgroup(path: str) -> None:
    """Remove the dead supervisor's job cgroup once it is empty (the kernel may need a moment
    to see its last process gone); a cgroup that stays busy is left, and logged."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                log.warning("could not remove the job cgroup %s: %s", path, exc)
                return
            time.sleep(ORPHAN_POLL)


def _group_is_the_jobs(pgid: int, start: int) -> bool:
    """The recorded group still names the job's: its leader is the job's main process, or it
    is gone (the number stays taken while any member of its group lives)."""
    now = process_tree.start_time(pgid)
    return now is None or now == start
