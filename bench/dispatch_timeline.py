"""Where a dispatch's time goes, stage by stage: prints figures, asserts nothing.

    python bench/dispatch_timeline.py [--samples 30] [--checkout DIR]

Starts a coordinator and an agent with 8 fake GPUs (dispatch_bench.Cluster, the checkout's own
.venv) and submits --samples 1-GPU jobs through the Python client, one at a time on an idle
queue, each a tiny program that prints the clock (dispatch_bench's stamp). Meanwhile `perf
trace -a` records a few system calls of every process (its overhead is a few microseconds a
call, not strace's ptrace stops), and each job's timeline is read off them:

    client        the submit call begins (a marker: getpgid(900000+N)) -> its Submit message
                  leaves the client (sendmsg)
    to reply      the coordinator reads it (recvmsg) -> its first write on that connection (the
                  answer, or the events of the client's watch stream, which shares it)
    to launch     the coordinator reads it -> the launch leaves on another (the agent's)
    agent         the agent reads the launch -> it asks its fork server for a supervisor
    supervisor    that request -> the job's exec (the fork server's clone, the supervisor's
                  cgroups, device rules and user switch, then execve)
    job           the job's exec (/bin/sh) -> the stamp program writes its line
    total         the marker -> the stamp's line

Medians (and the 10th-90th percentiles) over the samples after the first five; the same jobs'
wall p50 (the stamp's clock against the client's), for perf's overhead. Needs `perf` with
syscall tracepoints (root, or perf_event_paranoid <= -1), and a C compiler for the stamp.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dispatch_bench import Cluster, first_command_at, stamp_program  # noqa: E402

from gpuq.domain.states import JobState  # noqa: E402
from gpuq.submission import build_spec  # noqa: E402

SYSCALLS = "getpgid,sendmsg,recvmsg,sendto,clone,clone3,execve,write"
MARK = 900000
BIG = 200  # bytes: a message with a job spec, not a keepalive ping or a heartbeat
LINE = re.compile(r"\s*([0-9.]+) \(\s*[0-9. ]*(?:ms)?\): (.+?)/(\d+) (\w+)\((.*)\)\s+= (-?\d+)")
# a call that another one interrupted in the trace: its end, on a line of its own
CONTINUED = re.compile(
    r"\s*([0-9.]+) \(\s*[0-9. ]*(?:ms)?\): (.+?)/(\d+)\s+"
    r"\.\.\. \[continued\]: (\w+)\(\)\)\s+= (-?\d+)"
)
STAGES = ("client", "to reply", "to launch", "agent", "supervisor", "job", "total")


@dataclass
class Call:
    at: float  # ms, perf's clock
    comm: str
    tid: int
    name: str
    args: str
    result: int

    def fd(self) -> int:
        found = re.search(r"fd: (\d+)", self.args)
        return int(found.group(1)) if found else -1


def parse(path: Path) -> list[Call]:
    calls = []
    for line in path.read_text(errors="replace").splitlines():
        found = LINE.match(line)
        if found:
            at, comm, tid, name, args, result = found.groups()
            calls.append(Call(float(at), comm, int(tid), name, args, int(result)))
        elif found := CONTINUED.match(line):
            at, comm, tid, name, result = found.groups()
            calls.append(Call(float(at), comm, int(tid), name, "", int(result)))
    return sorted(calls, key=lambda c: c.at)


def threads(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


class Missing(Exception):
    """A step of a job's timeline is not in the trace."""


def first(calls: list[Call], after: float, test: Callable[[Call], bool]) -> Call:
    found = next((c for c in calls if c.at >= after and test(c)), None)
    if found is None:
        raise Missing
    return found


def spec_message(calls: list[Call], after: float, name: str, tids: set[int]) -> Call:
    """The first `name` (sendmsg, recvmsg) by one of `tids` of a message with a job spec."""
    return first(calls, after, lambda c: c.name == name and c.tid in tids and c.result > BIG)


def timeline(calls: list[Call], n: int, who: dict[str, set[int]]) -> list[float] | None:
    """One job's stage durations (ms), or None when a step is missing from the trace."""
    try:
        mark = first(calls, 0, lambda c: c.name == "getpgid" and c.args == f"pid: {MARK + n}")
        sent = spec_message(calls, mark.at, "sendmsg", who["client"])
        read = spec_message(calls, sent.at, "recvmsg", who["coordinator"])
        sends = [c for c in calls if c.name == "sendmsg" and c.tid in who["coordinator"]]
        reply = first(sends, read.at, lambda c: c.fd() == read.fd())  # on the client's connection
        launch = first(sends, read.at, lambda c: c.fd() != read.fd())  # on the agent's
        got = spec_message(calls, launch.at, "recvmsg", who["agent"])
        spawn = first(calls, got.at, lambda c: c.name == "sendto" and c.tid in who["agent"])
        job = first(calls, spawn.at, lambda c: c.name == "execve" and c.result == 0)
        stamp = first(calls, job.at + 0.001, lambda c: c.name == "execve" and c.result == 0)
        line = first(calls, stamp.at, lambda c: c.name == "write" and c.tid == stamp.tid)
    except Missing:
        return None
    return [
        sent.at - mark.at,
        reply.at - read.at,
        launch.at - read.at,
        spawn.at - got.at,
        job.at - spawn.at,
        line.at - job.at,
        line.at - mark.at,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--keep", action="store_true", help="keep the trace and folders")
    options = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("needs perf (linux-perf / linux-tools)")
    work = Path(tempfile.mkdtemp(prefix="gpuq-timeline-"))
    stamp = stamp_program(work)
    root = work / "cluster"
    root.mkdir()
    cluster = Cluster(options.checkout.resolve(), root, 8)
    trace_file = work / "trace.txt"
    tracer = None
    walls: list[float] = []
    try:
        time.sleep(0.5)
        who = {
            "client": threads(os.getpid()),
            "coordinator": threads(cluster.coordinator.pid),
            "agent": threads(cluster.agent.pid),
        }
        tracer = subprocess.Popen(
            ["perf", "trace", "-a", "-e", SYSCALLS, "-o", str(trace_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(2.0)  # perf sets its tracepoints up
        who["client"] = threads(os.getpid())  # the Submit stream's thread, once it exists
        for n in range(options.samples):
            path = root / f"stamp-{n}.out"
            spec = build_spec(wrap=stamp, gpus=1, chdir=str(root), output=str(path))
            time.sleep(0.07)  # an idle queue (not a multiple of gRPC's 100 ms waits)
            began = time.time()
            with contextlib.suppress(OSError):
                os.getpgid(MARK + n)  # the marker: no such process
            [job_id] = cluster.client.submit_spec(spec)
            cluster.events.wait(job_id, JobState.COMPLETED)
            walls.append((first_command_at(path) - began) * 1000)
            who["client"] |= threads(os.getpid())
        time.sleep(0.3)
    finally:
        if tracer is not None:
            tracer.send_signal(2)
            tracer.wait(30)
        cluster.close()
    calls = parse(trace_file)
    rows = [timeline(calls, n, who) for n in range(5, options.samples)]
    found = [r for r in rows if r is not None]
    print(f"{len(found)} of {len(rows)} timelines read; load {os.getloadavg()[0]:.2f}")
    for i, stage in enumerate(STAGES):
        values = sorted(r[i] for r in found)
        if values:
            low, high = values[len(values) // 10], values[len(values) * 9 // 10]
            print(f"  {stage:12} p50 {statistics.median(values):6.2f} ms  ({low:.2f}-{high:.2f})")
    print(f"  wall, stamp's clock against the client's: p50 {statistics.median(walls[5:]):.2f} ms")
    if options.keep:
        (work / "threads.json").write_text(json.dumps({k: sorted(v) for k, v in who.items()}))
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
