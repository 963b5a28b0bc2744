"""MPS shares end to end on the coordinator's side: a real coordinator and a raw agent stream
(a node's key) that registers one shared GPU and one that is not. Two 50% shares of one user
are dispatched to the shared unit together; a third waits with the reason; whole-GPU jobs
get the other unit only; the job record says which enforcement each has."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from pathlib import Path

import grpc
import pytest
from e2e_cluster import Cluster, wait_for

from gpuq.errors import InvalidInput, Unsatisfiable
from gpuq.identity import create_key_file, node_metadata
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc
from gpuq.v1 import types_pb2 as pb

GIB = 1 << 30


class SharedAgent:
    """A node with GPU 0 shared and GPU 1 not, that runs nothing: it records starts and
    answers stops with an end, and sends a heartbeat every 0.2 s."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.uuids = [f"GPU-{node}-0", f"GPU-{node}-1"]
        self.running: dict[int, apb.JobLaunch] = {}
        self._outbox: queue.Queue[apb.AgentMessage | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        key = create_key_file(cluster.home / "nodes" / f"{node}.key")
        self._channel = grpc.insecure_channel(f"unix:{cluster.home / 'gpuq.sock'}")
        register = apb.Register(
            node=node,
            cpus=8,
            mem=64 * GIB,
            fake=True,
            gpus=[
                pb.GpuUnit(uuid=u, index=i, name="fake", memory=80 * GIB, shared=i == 0)
                for i, u in enumerate(self.uuids)
            ],
        )
        self._outbox.put(apb.AgentMessage(register=register))
        self._stream = agent_pb2_grpc.AgentLinkStub(self._channel).Connect(
            iter(self._outbox.get, None), metadata=(node_metadata(node, key),)
        )
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._beat, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for message in self._stream:
                with self._lock:
                    for launch in message.start:
                        self.running[launch.job_id] = launch
                    for stop in message.stop:
                        self.running.pop(stop.job_id, None)
                        ended = apb.JobReport(
                            job_id=stop.job_id,
                            kind=apb.JobReport.ENDED,
                            end_state=stop.end_state,
                            result=pb.JobResult(reason=stop.reason, signal=15),
                            at=time.time(),
                            attempt=stop.attempt,
                        )
                        self._outbox.put(apb.AgentMessage(reports=[ended]))

    def _beat(self) -> None:
        while not self._closed.wait(0.2):
            usage = [pb.GpuUsage(uuid=u, health="ok") for u in self.uuids]
            heartbeat = apb.Heartbeat(at=time.time(), usage=usage)
            self._outbox.put(apb.AgentMessage(heartbeat=heartbeat))

    def close(self) -> None:
        self._closed.set()
        self._outbox.put(None)
        self._stream.cancel()
        self._channel.close()
        for thread in self._threads:
            thread.join(5)


def test_two_shares_of_one_user_share_a_gpu_and_a_third_waits(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    agent = SharedAgent(cluster, "raw")
    try:
        cluster.wait_node("raw", "up")
        first = cluster.submit("sleep 600", gpu_share=50, gpu_mem="20G")
        second = cluster.submit("sleep 600", gpu_share="50%", gpu_mem="20G")
        for job in (first, second):
            cluster.wait_state(job, "running")
        wait_for(lambda: {first, second} <= agent.running.keys(), what="both shares' starts")
        assert list(agent.running[first].gpus) == list(agent.running[second].gpus) == ["GPU-raw-0"]
        detail, _ = cluster.client().detail(first)
        assert detail.gpu_enforcement == "MPS (limits)"
        assert detail.spec.resources.gpu_share == 50

        third = cluster.submit("sleep 600", gpu_share=50, gpu_mem="20G")
        reason = wait_for(
            lambda: [r for r in cluster.client().detail(third)[0].pending.reasons if "%" in r],
            15,
            "the third share's reason",
        )[0]
        assert reason.startswith("needs a 50% share of a shared GPU with 20G free: "), reason
        assert "node raw's shared GPU 0 has only 0% left" in reason, reason

        # whole GPUs: the unshared one only, while shares live on the shared one
        whole = cluster.submit("sleep 600", gpus=1)
        cluster.wait_state(whole, "running")
        wait_for(lambda: whole in agent.running, what="the whole job's start")
        assert list(agent.running[whole].gpus) == ["GPU-raw-1"]
        assert cluster.client().detail(whole)[0].gpu_enforcement == "exclusive"
        waiting = cluster.submit("sleep 600", gpus=1)
        time.sleep(1)
        assert cluster.job(waiting).state.value == "pending"

        # one share ends: the third takes its place beside the other
        cluster.client().cancel(first)
        cluster.wait_state(third, "running", timeout=15)
        wait_for(lambda: third in agent.running, what="the third share's start")
        assert list(agent.running[third].gpus) == ["GPU-raw-0"]
        assert cluster.job(waiting).state.value == "pending"
    finally:
        agent.close()
        cluster.close()


def test_a_share_no_shared_gpu_can_hold_is_refused_at_submit(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    agent = SharedAgent(cluster, "raw")
    try:
        cluster.wait_node("raw", "up")
        with pytest.raises(Unsatisfiable, match="no shared GPU has that much memory"):
            cluster.submit("true", gpu_share=50, gpu_mem="200G")
        with pytest.raises(InvalidInput, match="needs --gpu-mem"):
            cluster.submit("true", gpu_share=50)
        with pytest.raises(InvalidInput, match="a share is of one GPU"):
            cluster.submit("true", gpu_share=50, gpu_mem="20G", gpus=2)
    finally:
        agent.close()
        cluster.close()
