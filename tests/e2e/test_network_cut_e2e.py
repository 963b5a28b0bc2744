"""A silent network cut between an agent and its coordinator (packets dropped, no reset): the
job's supervisor stops it when its lease runs out, before the coordinator gives the node up,
and the requeued job then runs on another node, never at the same time as the first run."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from pathlib import Path
from typing import NamedTuple

from e2e_cluster import Cluster, wait_for

from gpuq.domain.states import JobState

FENCE_TIME = 4.0
NODE_TIMEOUT = 8.0


class Connection:
    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.dead = upstream is None  # a blackholed connection never forwards again


class BlackholeProxy:
    """A TCP proxy between agent and coordinator. `blackhole()` keeps every socket open but
    forwards no byte either way (a silent cut: nothing is reset, nothing arrives); connections
    made meanwhile go nowhere either. `heal()` lets new connections through."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cut = threading.Event()
        self.lock = threading.Lock()
        self.connections: list[Connection] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        with self.lock:
            self.cut.set()
            for connection in self.connections:
                connection.dead = True

    def heal(self) -> None:
        self.cut.clear()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for connection in self.connections:
                for sock in (connection.client, connection.upstream):
                    if sock is not None:
                        sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = None if self.cut.is_set() else socket.create_connection(self.target)
            connection = Connection(client, upstream)
            with self.lock:
                self.connections.append(connection)
            threading.Thread(
                target=self._pump, args=(connection, client, upstream), daemon=True
            ).start()
            if upstream is not None:
                threading.Thread(
                    target=self._pump, args=(connection, upstream, client), daemon=True
                ).start()

    def _pump(self, connection: Connection, src: socket.socket, dst: socket.socket | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if self.cut.is_set():
                connection.dead = True
            if not data:
                if not connection.dead and dst is not None:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                return
            if connection.dead or dst is None:
                continue  # dropped on the floor
            try:
                dst.sendall(data)
            except OSError:
                return


class Stamp(NamedTuple):
    """A moment as a run recorded it: the wall clock (comparable with the coordinator's
    records) and the boot-time clock (/proc/uptime), which no NTP step moves."""

    wall: float
    up: float


def recorded(path: Path) -> list[Stamp]:
    """The stamps a run wrote to `path`, one a line ("WALL UP"); a line being written is
    left out."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [Stamp(float(w), float(u)) for w, u in (x.split() for x in lines if x.count(" ") == 1)]


def uptime() -> float:
    """Now on the clock the runs' `up` stamps are on (/proc/uptime, CLOCK_BOOTTIME)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def diagnosis(cluster: Cluster, cut: Stamp, ended_a: Stamp) -> str:
    """What a late or early fence needs to be understood (CI saw the job end 9.8 s after the
    cut once by the wall clock, not reproduced in 30 runs here, 12 of them under full CPU
    load): the times on both clocks (a difference is a step of the wall clock), the longest
    pause in run a's beats (a stalled host), the job's own result and the agent's and
    coordinator's last log lines."""
    beats = recorded(cluster.root / "run-a.beats")
    gaps = [b.up - a.up for a, b in itertools.pairwise(beats)]
    late = [b for b in beats if b.up > cut.up + FENCE_TIME]
    lines = [
        f"cut at {cut.wall:.3f} (up {cut.up:.2f}), run a ended at {ended_a.wall:.3f} "
        f"(up {ended_a.up:.2f}): +{ended_a.up - cut.up:.2f} s on the boot-time clock, "
        f"+{ended_a.wall - cut.wall:.2f} s on the wall clock",
        f"run a: {len(beats)} beats, the longest pause {max(gaps, default=0):.2f} s, "
        f"{len(late)} beats later than fence_time after the cut",
    ]
    for result in cluster.root.rglob("result.json"):
        lines.append(f"{result}: {result.read_text(errors='replace')[:400]}")
    for name in ("agent-a", "coordinator"):
        log = cluster.root / f"{name}.log"
        tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
        lines += [f"--- {name}.log (last {len(tail)} lines)", *tail]
    return "\n".join(lines)


def test_a_silently_cut_agent_fences_its_job_before_the_node_is_given_up(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, fence_time=FENCE_TIME, node_timeout=NODE_TIMEOUT)
    proxy: BlackholeProxy | None = None
    try:
        cluster.start_coordinator()
        proxy = BlackholeProxy(cluster.tcp_address)
        cluster.agents["a"] = cluster._spawn(
            [
                "agent",
                "--node-name",
                "a",
                "--fake-gpus",
                "1xA100-80GB",
                "--coordinator",
                proxy.address,
            ],
            "agent-a",
        )
        cluster.wait_node("a", "up")
        # each run records its start, a beat every 0.1 s and, when stopped, its end
        root = cluster.root
        script = (
            "f={root}/run-$GPUQ_NODE; "
            'now() { read -r up _ < /proc/uptime; echo "$(date +%s.%N) $up"; }; '
            "now > $f.start; "
            "trap 'now > $f.end; exit 143' TERM; "
            "while true; do now >> $f.beats; "
            "if [ $GPUQ_NODE != a ] && [ -e {root}/gate ]; then break; fi; sleep 0.1; done; "
            "now > $f.end"
        ).replace("{root}", str(root))
        job_id = cluster.submit(script, gpus=1)
        assert cluster.wait_state(job_id, "running").node == "a"
        wait_for(lambda: len(recorded(root / "run-a.beats")) >= 3, what="run a to beat")
        cluster.start_agent("b", "1xA100-80GB")

        proxy.blackhole()
        cut = Stamp(time.time(), uptime())

        # the agent stops its job itself: the job's own record says when
        ended_a = wait_for(
            lambda: recorded(root / "run-a.end"), timeout=NODE_TIMEOUT + 5, what="run a to end"
        )[0]
        # fence_time after the last heartbeat the coordinator confirmed (one every 0.3 s):
        # not at once, and well before the node timeout (timed as the fence is, on a clock
        # no NTP step moves)
        assert cut.up + FENCE_TIME - 0.5 < ended_a.up < cut.up + FENCE_TIME + 1.5, diagnosis(
            cluster, cut, ended_a
        )
        last_beat_a = recorded(root / "run-a.beats")[-1]
        assert last_beat_a.up <= ended_a.up
        # the coordinator has not given the node up yet
        assert cluster.job(job_id).state is JobState.RUNNING
        assert {n.name: n for n in cluster.client().nodes()}["a"].state == "up"

        # after its node timeout the coordinator gives node a up and requeues the job on b
        cluster.wait_node("a", "down", timeout=NODE_TIMEOUT + 10)
        wait_for(lambda: recorded(root / "run-b.start"), timeout=15, what="run b to start")
        _, history = cluster.client().detail(job_id)
        given_up = [e for e in history if e.to_state is JobState.NODE_FAIL]
        assert len(given_up) == 1 and "no word from its agent" in given_up[0].reason, history
        assert ended_a.wall < given_up[0].at, (ended_a, given_up[0].at)

        (root / "gate").touch()
        job = cluster.wait_state(job_id, "completed", "failed", "cancelled", timeout=15)
        assert job.state is JobState.COMPLETED and job.node == "b", job
        # the two runs never overlapped: b started after a's last sign of life
        start_b = recorded(root / "run-b.start")[0]
        assert max(ended_a.up, last_beat_a.up) < start_b.up, (ended_a, last_beat_a, start_b)
        assert recorded(root / "run-a.beats")[-1] == last_beat_a  # a never ran again

        # the network heals: agent a connects again and its node comes back
        proxy.heal()
        cluster.wait_node("a", "up", timeout=15)
    finally:
        cluster.close()
        if proxy is not None:
            proxy.close()
