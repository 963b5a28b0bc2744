"""A follower node's step worker: `python -m gpuq.steps.step_worker`, started by the agent in
place of the batch script on every node of a multi-node job but the first, as the job's user,
in the job's cgroup, with the node's GPUs and the job's environment.

It listens on (GPUQ_NODE_ADDRS[GPUQ_NODE_INDEX], GPUQ_STEP_PORT) and serves srun's steps, one
connection per step, several at once if the script runs steps in the background. A connection
must first answer the HMAC challenge with GPUQ_STEP_KEY (gpuq.steps.step_wire). Then it names
the command and this node's tasks with their variables; the worker starts them as its children,
each in its own process group, with the client's environment over its own but this node's own
facts kept (NODE_LOCAL: its GPUs, its name), streams their output back tagged by rank, and
reports each end. When told, or when the connection drops (srun was killed, the leader was
lost), it stops its tasks: SIGTERM to each group, SIGKILL two seconds later. A client's mistake
ends that connection, never the worker; the worker ends when the agent stops it (SIGTERM), and
takes its tasks with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from gpuq.errors import InvalidInput
from gpuq.steps.step_wire import (
    HANDSHAKE_TIMEOUT,
    ProtocolError,
    challenge,
    pack_bytes,
    parse_key,
    recv,
    send,
)
from gpuq.steps.task_layout import bind_gpus
from gpuq.steps.task_procs import STOP_GRACE, TaskProcess

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# facts about this node that the leader's environment must not overwrite
NODE_LOCAL = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ROCR_VISIBLE_DEVICES",
        "GPUQ_NODE",
        "GPUQ_NODE_INDEX",
        "SLURMD_NODENAME",
        "SLURM_GPUS_ON_NODE",
        "SLURM_CPUS_ON_NODE",
        "SLURM_JOB_CPUS_PER_NODE",
        "SLURM_TOPOLOGY_ADDR",
        "HOSTNAME",
        "TMPDIR",
        "SLURM_TMPDIR",
    }
)
GPU_LOCAL = frozenset(
    {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES"}
)
MAX_TASKS = 4096
END_WAIT = STOP_GRACE + 3.0  # seconds a closing session waits for its stopped tasks


class StepSession:
    """One connection: one step's tasks on this node."""

    def __init__(self, conn: socket.socket, key: bytes, own_env: Mapping[str, str]) -> None:
        self.conn = conn
        self.key = key
        self.own_env = dict(own_env)
        self.tasks: list[TaskProcess] = []
        self.send_lock = threading.Lock()
        self.broken = False
        self.welcomed = False
        self.done = threading.Event()  # the connection is over and its tasks ended

    def serve(self) -> None:
        try:
            self.conn.settimeout(HANDSHAKE_TIMEOUT)
            challenge(self.conn, self.key)
            self.welcomed = True
            self.conn.settimeout(None)
            while True:
                message = recv(self.conn)
                if message is None:
                    break
                self.handle(message)
        except Exception as exc:  # a client's mistake ends its connection, never the worker
            _log(f"step connection ended: {exc}")
            if self.welcomed and not isinstance(exc, OSError):
                self._send({"type": "error", "message": str(exc)})
        finally:
            self.stop_all()
            deadline = time.monotonic() + END_WAIT
            for task in self.tasks:
                task.ended.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(OSError):
                self.conn.close()
            self.done.set()

    def handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "start":
            if self.tasks:
                raise ProtocolError("a second start on one connection")
            self.start(message)
        elif kind == "signal":
            number = message.get("signal")
            if not isinstance(number, int) or number not in _SIGNALS:
                raise ProtocolError(f"not a signal: {number!r}")
            for task in self.tasks:
                task.signal(number)
        elif kind == "kill":
            self.stop_all()
        else:
            raise ProtocolError(f"unknown message {kind!r}")

    def start(self, message: dict[str, Any]) -> None:
        argv = message.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ProtocolError("argv must be a list of strings")
        cwd = message.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ProtocolError("cwd must be a string")
        if cwd is not None and not os.path.isdir(cwd):
            cwd = self.own_env.get("HOME") or "/"  # SLURM falls back alike (and says so)
        gpus_per_task = message.get("gpus_per_task")
        if gpus_per_task is not None and (not isinstance(gpus_per_task, int) or gpus_per_task < 0):
            raise ProtocolError("gpus_per_task must be a whole number")
        tasks = message.get("tasks")
        if not isinstance(tasks, list) or not tasks or len(tasks) > MAX_TASKS:
            raise ProtocolError("tasks must be a non-empty list")
        base = {} if message.get("replace_env") else dict(self.own_env)
        base.update(checked_env(message.get("env")))
        for name in NODE_LOCAL:  # this node's facts, never the leader's
            if name in self.own_env:
                base[name] = self.own_env[name]
            else:
                base.pop(name, None)
        visible = self.own_env.get("CUDA_VISIBLE_DEVICES", "")
        planned: list[TaskProcess] = []
        for spec in tasks:
            if not isinstance(spec, dict):
                raise ProtocolError("a task must be an object")
            rank, local_id = spec.get("rank"), spec.get("local_id")
            if not isinstance(rank, int) or not isinstance(local_id, int) or local_id < 0:
                raise ProtocolError("a task needs a rank and a local_id")
            env = dict(base)
            # the task's own variables (rank, node name...) as srun computed them; its GPUs
            # are this node's to give
            per_task = checked_env(spec.get("env"))
            env.update({k: v for k, v in per_task.items() if k not in GPU_LOCAL})
            bound = bind_gpus(visible, local_id, gpus_per_task)
            if bound is not None:
                env["CUDA_VISIBLE_DEVICES"] = bound
            planned.append(TaskProcess(rank, argv, env, cwd, self._output, self._exit))
        self.tasks = planned
        for task in planned:
            task.start()
            if task.pid is not None:
                self._send({"type": "started", "rank": task.rank, "pid": task.pid})

    def _output(self, rank: int, fd: int, data: bytes) -> None:
        self._send({"type": "out", "rank": rank, "fd": fd, "data": pack_bytes(data)})

    def _exit(self, rank: int, code: int | None, number: int | None) -> None:
        self._send({"type": "exit", "rank": rank, "code": code, "signal": number})

    def _send(self, message: dict[str, Any]) -> None:
        """Send from any thread; a dead connection stops this step's tasks."""
        with self.send_lock:
            if self.broken:
                return
            try:
                send(self.conn, message)
                return
            except (OSError, ProtocolError) as exc:
                self.broken = True
                _log(f"cannot reach srun: {exc}; stopping this step's tasks")
        self.stop_all()
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)

    def stop_all(self) -> None:
        for task in self.tasks:
            task.stop()


def checked_env(value: object) -> dict[str, str]:
    """An environment sent by a client: names that are names, values that are strings."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError("env must be an object")
    for name, text in value.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ProtocolError(f"not a variable name: {name!r}")
        if not isinstance(text, str) or "\0" in text:
            raise ProtocolError(f"the value of {name} is not text")
    return dict(value)


_SIGNALS = frozenset(int(s) for s in signal.valid_signals()) - {0}


class StepWorker:
    """The listener and its sessions."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        try:
            self.key = parse_key(environ.get("GPUQ_STEP_KEY", ""))
            index = int(environ.get("GPUQ_NODE_INDEX", ""))
            addrs = [a for a in environ.get("GPUQ_NODE_ADDRS", "").split(",") if a]
            self.address = addrs[index]
            self.port = int(environ.get("GPUQ_STEP_PORT", ""))
        except (ValueError, IndexError, ProtocolError) as exc:
            raise InvalidInput(
                "step worker environment",
                "GPUQ_STEP_KEY/GPUQ_NODE_INDEX/GPUQ_NODE_ADDRS/GPUQ_STEP_PORT",
                str(exc) or "missing",
            ) from None
        self.environ = dict(environ)
        self.sessions: list[StepSession] = []
        self.listener = _listen(self.address, self.port)

    def serve_forever(self) -> None:
        while True:
            try:
                conn, _peer = self.listener.accept()
            except InterruptedError:
                continue
            except OSError as exc:
                _log(f"accept failed: {exc}")
                time.sleep(0.1)
                continue
            session = StepSession(conn, self.key, self.environ)
            self.sessions = [s for s in self.sessions if not s.done.is_set()]
            self.sessions.append(session)
            threading.Thread(target=session.serve, daemon=True).start()

    def stop(self) -> None:
        """Every task of every step: stopped, and waited for (bounded)."""
        for session in self.sessions:
            session.stop_all()
        deadline = time.monotonic() + END_WAIT
        for session in self.sessions:
            for task in session.tasks:
                task.ended.wait(max(0.0, deadline - time.monotonic()))


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(64)
    return listener


def _log(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"gpuq step worker: {line}\n")
        sys.stderr.flush()


def main() -> int:
    try:
        worker = StepWorker(os.environ)
    except (InvalidInput, OSError) as exc:
        _log(str(exc))
        return 2

    def leave(number: int, frame: FrameType | None) -> None:
        worker.stop()
        os._exit(128 + number)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    signal.signal(signal.SIGHUP, leave)
    worker.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
