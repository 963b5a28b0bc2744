"""srun's side of one follower node: the connection to its step worker (gpuq.steps.step_wire),
the start of that node's tasks, and a reader thread that turns the worker's messages into
StepEvents on srun's queue. A connection that ends before every task of the node reported its
end becomes one "lost" event: those tasks count as failed.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuq.steps.step_wire import (
    HANDSHAKE_TIMEOUT,
    ProtocolError,
    answer_challenge,
    recv,
    send,
    unpack_bytes,
)

# seconds a step waits for a step worker that is not listening yet (it starts with the job)
WORKER_START_PATIENCE = 60.0


@dataclass
class StepEvent:
    """What srun's main loop reacts to: out, exit, lost (a node's connection), signal."""

    kind: str
    rank: int = -1
    fd: int = 1
    data: bytes = b""
    code: int | None = None
    signal: int | None = None
    node_id: int = -1
    text: str = ""


class RemoteNode:
    def __init__(
        self, node_id: int, name: str, addr: str, port: int, events: queue.SimpleQueue[StepEvent]
    ) -> None:
        self.node_id = node_id
        self.name = name
        self.addr = addr
        self.port = port
        self.events = events
        self.sock: socket.socket | None = None
        self.ranks: set[int] = set()
        self.ended: set[int] = set()
        self.lock = threading.Lock()
        self.closing = False

    def connect(self, key: bytes, patience: float = WORKER_START_PATIENCE) -> None:
        """Connect and prove the key. The job's step workers start at the same moment as
        its script, so a worker not listening yet (connection refused) is tried again for up
        to `patience` seconds; any other failure is at once."""
        deadline = time.monotonic() + patience
        while True:
            try:
                sock = socket.create_connection((self.addr, self.port), timeout=HANDSHAKE_TIMEOUT)
                break
            except ConnectionRefusedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answer_challenge(sock, key)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def start(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        replace_env: bool,
        tasks: list[dict[str, Any]],
        gpus_per_task: int | None,
    ) -> None:
        assert self.sock is not None
        self.ranks = {int(t["rank"]) for t in tasks}
        message = {
            "type": "start",
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "replace_env": replace_env,
            "tasks": tasks,
            "gpus_per_task": gpus_per_task,
        }
        with self.lock:
            send(self.sock, message)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.sock is not None
        why = "its step worker closed the connection"
        try:
            while self.ended != self.ranks:
                message = recv(self.sock)
                if message is None:
                    break
                self._handle(message)
            else:
                return
        except (OSError, ProtocolError, ValueError, TypeError, KeyError) as exc:
            why = f"its step worker: {exc}"
        if not self.closing:
            self.events.put(StepEvent("lost", node_id=self.node_id, text=f"{self.name}: {why}"))

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "error":
            raise ProtocolError(f"it refused the step: {message.get('message')}")
        rank = message.get("rank")
        if not isinstance(rank, int) or rank not in self.ranks:
            if kind == "started":
                return
            raise ProtocolError(f"a message about task {rank!r}, not one of this node's")
        if kind == "out":
            fd = 2 if message.get("fd") == 2 else 1
            self.events.put(StepEvent("out", rank=rank, fd=fd, data=unpack_bytes(message["data"])))
        elif kind == "exit":
            code, number = message.get("code"), message.get("signal")
            self.ended.add(rank)
            self.events.put(
                StepEvent(
                    "exit",
                    rank=rank,
                    code=code if isinstance(code, int) else None,
                    signal=number if isinstance(number, int) else None,
                )
            )

    def kill(self) -> None:
        self._send({"type": "kill"})

    def signal(self, number: int) -> None:
        self._send({"type": "signal", "signal": int(number)})

    def _send(self, message: dict[str, Any]) -> None:
        if self.sock is None:
            return
        with self.lock, contextlib.suppress(OSError, ProtocolError):
            send(self.sock, message)

    def close(self) -> None:
        self.closing = True
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.sock.close()
