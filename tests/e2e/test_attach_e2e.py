"""Interactive jobs' terminals on the coordinator's side (issue 13): a real coordinator, a raw
agent stream (tests/e2e/raw_agent.py) that plays the node, and Client.attach as gpuq run uses it.

The client sees its job pending (with the reason) then running; its input and window size reach
the agent as PtyInput, and signals as SignalJob; the agent's output reaches the client in order,
all of it before `ended`, which carries the exit code; output from another node or another start
is ignored; a second attachment and another user's are refused; closing the stream cancels the
job; a slow reader makes the coordinator pause the agent's reading, and resume it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import Cluster, wait_for
from raw_agent import RawAgent

from gpuq.client import Client
from gpuq.client_attach import Attachment
from gpuq.config.loading import load_settings
from gpuq.domain.interactive_jobs import Terminal
from gpuq.errors import InvalidInput, NotFound, PermissionDenied, Unsatisfiable
from gpuq.submission import build_spec
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import queue_pb2

MIB = 1 << 20


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    try:
        yield cluster
    finally:
        cluster.close()


def submit_interactive(cluster: Cluster, **options: Any) -> int:
    spec = build_spec(
        wrap='exec "$@"',
        args=("cmd",),
        environ=cluster.env,
        chdir=str(cluster.root),
        **options,
    )
    spec = replace(spec, source="--run", terminal=Terminal(rows=24, cols=80, term="xterm"))
    return cluster.client().submit_spec(spec)[0]


class Replies:
    """An attachment's replies, read by a thread into a queue (a test waits with timeouts)."""

    def __init__(self, attachment: Attachment) -> None:
        self.attachment = attachment
        self._queue: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self.attachment.replies():
                self._queue.put(reply)
        except Exception as error:
            self._queue.put(error)
        self._queue.put(None)

    def next(self, timeout: float = 15.0) -> queue_pb2.AttachReply:
        item = self._queue.get(timeout=timeout)
        if isinstance(item, Exception):
            raise item
        assert item is not None, "the stream ended"
        return item  # type: ignore[no-any-return]

    def until(
        self, wanted: Callable[[queue_pb2.AttachReply], bool], timeout: float = 15.0
    ) -> tuple[queue_pb2.AttachReply, bytes]:
        """The first reply `wanted` takes, and the output that came before it."""
        deadline = time.monotonic() + timeout
        output = bytearray()
        while True:
            reply = self.next(max(0.1, deadline - time.monotonic()))
            if wanted(reply):
                return reply, bytes(output)
            output += reply.output


def refusal(attachment: Attachment) -> Exception:
    try:
        for _ in attachment.replies():
            pass
    except Exception as error:
        return error
    raise AssertionError("the attachment was not refused")


def test_pending_running_input_output_and_the_exit_code(cluster: Cluster) -> None:
    job = submit_interactive(cluster, gpus=1)
    replies = Replies(cluster.client().attach(job))
    first = replies.next()
    assert first.state == "pending" and first.reason, first

    agent = RawAgent(cluster, "raw", gpus=1)
    other = RawAgent(cluster, "other", gpus=0)
    try:
        cluster.wait_node("raw", "up")
        running, _ = replies.until(lambda r: r.state == "running")
        assert running.node == "raw"
        attempt = agent.attempt(job)
        # the window size goes first, then input, a new size, a signal, the end of input
        wait_for(lambda: [(p.rows, p.cols) for p in agent.pty_inputs(job)] == [(24, 80)])
        replies.attachment.send(b"hello\n")
        replies.attachment.resize(50, 132)
        replies.attachment.signal(2)
        replies.attachment.eof()
        wait_for(lambda: any(p.eof for p in agent.pty_inputs(job)), what="the end of input")
        inputs = agent.pty_inputs(job)
        assert b"".join(p.data for p in inputs) == b"hello\n"
        assert [(p.rows, p.cols) for p in inputs if p.rows] == [(24, 80), (50, 132)]
        assert all(p.attempt == attempt for p in inputs)
        wait_for(lambda: [(s.job_id, s.signal) for s in agent.signals] == [(job, 2)])

        # another node's output, and another start's, are ignored
        other.send(
            apb.AgentMessage(pty=[apb.PtyOutput(job_id=job, attempt=attempt, data=b"FOREIGN")])
        )
        agent.output(job, b"STALE", attempt=attempt + 7)
        time.sleep(0.5)
        # in order, and all of it before the end (the last piece shares the end's message)
        chunks = [f"line {i}\n".encode() * 50 for i in range(200)]
        for chunk in chunks[:-1]:
            agent.output(job, chunk)
        last = apb.PtyOutput(job_id=job, attempt=attempt, data=chunks[-1], closed=True)
        agent.send(apb.AgentMessage(pty=[last], reports=[agent.ended(job, exit_code=3)]))
        ended, output = replies.until(lambda r: r.ended)
        assert output == b"".join(chunks)
        assert ended.result.exit_code == 3 and ended.state == "failed"
        assert cluster.job(job).state.value == "failed"
    finally:
        agent.close()
        other.close()


def test_refusals_and_a_closed_stream_cancels_the_job(cluster: Cluster) -> None:
    job = submit_interactive(cluster, gpus=1)  # no node: it waits
    first = cluster.client().attach(job)
    replies = Replies(first)
    assert replies.next().state == "pending"

    second = refusal(cluster.client().attach(job))
    assert isinstance(second, Unsatisfiable) and "already attached" in str(second)

    token = cluster.client().issue_token("bob")
    settings = load_settings(home=cluster.home)
    with Client(address=cluster.tcp_address, token=token, settings=settings, timeout=10) as bob:
        refused = refusal(bob.attach(job))
    assert isinstance(refused, PermissionDenied) and "belongs to" in str(refused)

    batch = cluster.submit("true", hold=True)
    refused = refusal(cluster.client().attach(batch))
    assert isinstance(refused, Unsatisfiable) and "not interactive" in str(refused)

    first.close()
    done = cluster.wait_state(job, "cancelled")
    assert "went away" in done.reason


def test_a_slow_reader_pauses_the_agent_and_a_closed_stream_stops_a_running_job(
    cluster: Cluster,
) -> None:
    agent = RawAgent(cluster, "raw", gpus=1)
    try:
        cluster.wait_node("raw", "up")
        job = submit_interactive(cluster, gpus=1)
        attachment = cluster.client().attach(job)
        replies = attachment.replies()
        while next(replies).state != "running":
            pass
        # 12 MiB the client does not read yet: the coordinator holds it and pauses the agent
        chunks = [bytes([i % 251]) * (64 << 10) for i in range(12 * 16)]
        for chunk in chunks:
            agent.output(job, chunk)
        wait_for(lambda: any(p.pause for p in agent.pty_inputs(job)), what="a pause")
        assert not any(p.resume for p in agent.pty_inputs(job))
        output = bytearray()
        while len(output) < 12 * MIB:
            output += next(replies).output
        assert bytes(output) == b"".join(chunks)
        wait_for(lambda: any(p.resume for p in agent.pty_inputs(job)), what="a resume")

        attachment.close()
        done = cluster.wait_state(job, "cancelled")
        assert "went away" in done.reason
        assert [s.job_id for s in agent.stops] == [job]
    finally:
        agent.close()


def test_wire_values_out_of_range_end_the_stream(cluster: Cluster) -> None:
    missing = refusal(cluster.client().attach(0))
    assert isinstance(missing, NotFound)
    for bad in (
        queue_pb2.AttachRequest(signal=99),
        queue_pb2.AttachRequest(rows=70000, cols=80),
        queue_pb2.AttachRequest(rows=24),  # a size needs both
        queue_pb2.AttachRequest(input=b"x" * (64 * 1024 + 1)),
    ):
        job = submit_interactive(cluster, gpus=1)
        attachment = cluster.client().attach(job)
        attachment._requests.put(bad)  # as a client of its own would send it
        refused = refusal(attachment)
        assert isinstance(refused, InvalidInput), (bad, refused)
        assert "went away" in cluster.wait_state(job, "cancelled").reason
