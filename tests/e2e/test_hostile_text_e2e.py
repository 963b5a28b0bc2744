"""Text is data: what users and agents say is refused where it enters or escaped where it is
printed (also when stdout is not a terminal), and a hostile agent registration ends its stream
with a clear INVALID_ARGUMENT. (Which registrations are refused, and that a node's reports on
jobs not dispatched to it change nothing: tests/store/test_agent_reports_coordinator.py, in
process.)"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from e2e_cluster import Cluster, wait_for

from gpuq.config.loading import load_settings
from gpuq.domain.limits import CONTROL_RE, MAX_AGENT_MESSAGE_BYTES
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc
from gpuq.v1 import types_pb2 as pb

OSC = "\x1b]0;pwned\x07"  # sets a terminal's title; OSC 8 and 52 do worse


def agent_metadata(cluster: Cluster, node: str) -> tuple[tuple[str, str], ...]:
    """How a raw agent stream authenticates as `node` (the one place to change when agent
    identity changes): the node's key, made in the coordinator's nodes folder."""
    from gpuq.identity import create_key_file, node_metadata

    settings = load_settings(home=cluster.home)
    key = create_key_file(settings.nodes_dir / f"{node}.key")
    return (node_metadata(node, key),)


class RawAgent:
    """An agent stream driven by hand: messages in, the coordinator's messages out."""

    def __init__(self, cluster: Cluster, node: str, metadata_node: str | None = None) -> None:
        settings = load_settings(home=cluster.home)
        self._requests: queue.Queue[apb.AgentMessage | None] = queue.Queue()
        self._channel = grpc.insecure_channel(
            settings.coordinator_address,
            options=[("grpc.max_receive_message_length", MAX_AGENT_MESSAGE_BYTES)],
        )
        stub = agent_pb2_grpc.AgentLinkStub(self._channel)
        self.node = node
        self.replies: Iterator[apb.CoordinatorMessage] = stub.Connect(
            iter(self._requests.get, None),
            metadata=agent_metadata(cluster, metadata_node or node),
            timeout=60,
        )

    def send(self, **fields: Any) -> None:
        self._requests.put(apb.AgentMessage(**fields))

    def register(self, **fields: Any) -> apb.CoordinatorMessage:
        fields.setdefault("node", self.node)
        fields.setdefault("cpus", 4)
        fields.setdefault("mem", 8 << 30)
        self.send(register=apb.Register(**fields))
        return next(self.replies)

    def close(self) -> None:
        self._requests.put(None)
        self._channel.close()


def gpu(uuid: str = "GPU-raw-0", name: str = "Raw GPU") -> pb.GpuUnit:
    return pb.GpuUnit(uuid=uuid, index=0, name=name, memory=16 << 30)


def assert_no_raw_controls(text: str) -> None:
    for line in text.splitlines():
        assert not CONTROL_RE.search(line), repr(line)


def test_a_hostile_registration_is_refused(lone_coordinator: Cluster) -> None:
    """Over gRPC: the stream ends INVALID_ARGUMENT with the refusal (which fields are refused:
    tests/store/test_agent_reports_coordinator.py)."""
    cluster = lone_coordinator
    agent = RawAgent(cluster, "raw")
    try:
        with pytest.raises(grpc.RpcError) as caught:
            agent.register(gpus=[gpu(name=f"H100{OSC}")])
    finally:
        agent.close()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = caught.value.details() or ""
    assert "registration" in message and "name" in message, message
    assert not CONTROL_RE.search(message)
    assert "raw" not in {n.name for n in cluster.client().nodes()}


def test_hostile_text_comes_out_escaped(lone_coordinator: Cluster) -> None:
    cluster = lone_coordinator
    # a job's arguments may hold anything but NUL (they are the script's business)
    job_id = cluster.client().submit(
        None,
        f"arg{OSC}",
        "two\nlines",
        wrap="sleep 30",
        environ=cluster.env,
        chdir=str(cluster.root),
        hold=True,
    )
    show = cluster.gpuq("show", str(job_id))
    assert show.returncode == 0, show.stderr
    assert_no_raw_controls(show.stdout)
    assert "arg\\x1b]0;pwned\\x07 two\\nlines" in show.stdout
    as_json = cluster.gpuq("show", "--json", str(job_id))
    assert as_json.stdout.isascii() and "\x1b" not in as_json.stdout
    # a reason with an escape is refused where it enters (or, if it got in, printed escaped)
    cancel = cluster.gpuq("cancel", "--reason", f"bye{OSC}\n", str(job_id))
    assert_no_raw_controls(cancel.stdout + cancel.stderr)
    if cancel.returncode == 0:
        history = cluster.gpuq("show", str(job_id))
        assert_no_raw_controls(history.stdout)
        assert "bye\\x1b]0;pwned\\x07\\n" in history.stdout
    else:
        assert cancel.returncode == 2 and "\\x1b" in cancel.stderr, cancel.stderr
        cluster.client().cancel(job_id)
    # an agent's heartbeat text is kept, cleaned (a heartbeat is never refused for it)
    agent = RawAgent(cluster, "raw")
    try:
        assert agent.register(gpus=[gpu()]).HasField("registered")
        agent.send(
            heartbeat=apb.Heartbeat(
                at=time.time(),
                usage=[
                    pb.GpuUsage(
                        uuid="GPU-raw-0",
                        health="unhealthy",
                        health_reason=f"xid 79{OSC}",
                        notes=["pid 1\x1b[2J"],
                    )
                ],
                not_accepting=True,
                not_accepting_reason=f"broken{OSC}",
            )
        )
        wait_for(lambda: "xid 79" in cluster.gpuq("nodes").stdout, 10, "the heartbeat to be shown")
        for command in (("nodes",), ("status",), ("queue",), ("nodes", "--json")):
            result = cluster.gpuq(*command)
            assert result.returncode == 0, (command, result.stderr)
            assert_no_raw_controls(result.stdout)
            assert "\x1b" not in result.stdout
    finally:
        agent.close()
