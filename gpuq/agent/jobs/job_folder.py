"""A job's folder on the agent's node, `<state>/jobs/<id>`: the contract between the agent
(gpuq/agent/jobs/supervisors.py) and the job's supervisor (gpuq/agent/native/supervisor.c,
forked by the fork server).

The agent writes spec.json (a LaunchSpec) and asks the fork server for a supervisor; the
supervisor writes the script, supervisor.pid ("<pid> <start time>"), job.pid (the job's main
process, also its process group, and its cgroup folder) and, when the job has ended,
result.json, and deletes the folder once the agent acks the end. On a root agent the folder is
0711 (the job's user passes through to its script, which is the user's, 0700; everything else
is root's, 0600). The two talk over `<state>/agent.sock` in newline-delimited JSON:
  supervisor -> agent  {"type": "hello", "job_id", "pid", "job_pid", "started_at",
                        "status": "running"}  (or "status": "ended" with "result")
                       {"type": "ended", "job_id", "result"}
  agent -> supervisor  {"type": "stop", "end_state", "reason", "signal", "grace"}
                       {"type": "signal", "signal"}
                       {"type": "ack"}: the end is recorded; delete the folder and exit
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from gpuq.agent.jobs import process_tree

ACK_WAIT_DEFAULT = 600.0  # seconds an ended supervisor waits for the agent's ack

SPEC_FILE = "spec.json"
PID_FILE = "supervisor.pid"
# "<job pid> <start time> <how>\n" then a line per cgroup folder of the job; how: "clone3" (born
# in its v2 group), "vfork", or "vfork:<errno name or number>" (clone3 refused: joined by writing)
JOB_PID_FILE = "job.pid"
RESULT_FILE = "result.json"
SOCKET_NAME = "agent.sock"

Message = dict[str, Any]


def write_json_atomic(path: Path, data: Message) -> None:
    """Write `path` so that a reader sees no file or the whole new one, even after a crash.

    temp + fsync + rename. The folder is not fsynced (a second journal commit per job): if a
    crash loses the rename, the complete, fsynced `<name>.tmp` is there, and read_json_durable
    falls back to it.
    """
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(data, separators=(",", ":")).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def read_json_durable(path: Path) -> Message | None:
    """What write_json_atomic left at `path` (or in its temporary), None when nothing usable."""
    for candidate in (path, Path(f"{path}.tmp")):
        try:
            data = json.loads(candidate.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def supervisor_alive(job_dir: Path) -> int | None:
    """The pid of the job folder's supervisor when it still runs (pid and start time match)."""
    try:
        pid_text, start_text = (job_dir / PID_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if str(process_tree.start_time(pid)) != start_text or process_tree.has_exited(pid):
        return None
    return pid


def remove_job_dir(job_dir: Path) -> None:
    """Delete a job folder (flat: spec, script, pid file, result and their temporaries)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(job_dir):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        job_dir.rmdir()
