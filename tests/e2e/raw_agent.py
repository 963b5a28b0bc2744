"""A raw agent for coordinator-level end-to-end tests: a real AgentLink stream with a node's key
and its own heartbeats, that runs no processes. It records what the coordinator sends (starts,
stops, signals, terminal input) and says what a test makes it say (job samples, terminal
output, job ends), so a test drives the coordinator's side of the agent contract exactly.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence

import grpc
from e2e_cluster import Cluster

from gpuq.identity import create_key_file, node_metadata
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc
from gpuq.v1 import types_pb2 as pb

GIB = 1 << 30
Sampler = Callable[[int, apb.JobLaunch], apb.JobSample | None]


class RawAgent:
    """Node `node` with `gpus` fake units (those in `shared` shared): starts are recorded in
    `running`, stops in `stops` (and answered with an end unless answer_stops is False),
    signals in `signals`, terminal input in `pty`. Every 0.2 s a heartbeat, with a sample per
    running job where `sampler` gives one."""

    def __init__(
        self,
        cluster: Cluster,
        node: str,
        gpus: int = 1,
        *,
        shared: Sequence[int] = (),
        sampler: Sampler | None = None,
        answer_stops: bool = True,
    ) -> None:
        self.node = node
        self.uuids = [f"GPU-{node}-{i}" for i in range(gpus)]
        self.sampler = sampler
        self.answer_stops = answer_stops
        self.running: dict[int, apb.JobLaunch] = {}
        self.stops: list[apb.StopJob] = []
        self.signals: list[apb.SignalJob] = []
        self.pty: list[apb.PtyInput] = []
        self.lock = threading.Lock()
        self._outbox: queue.Queue[apb.AgentMessage | None] = queue.Queue()
        self._closed = threading.Event()
        key = create_key_file(cluster.home / "nodes" / f"{node}.key")
        self._channel = grpc.insecure_channel(f"unix:{cluster.home / 'gpuq.sock'}")
        register = apb.Register(
            node=node,
            cpus=8,
            mem=64 * GIB,
            fake=True,
            gpus=[
                pb.GpuUnit(uuid=u, index=i, name="fake", memory=80 * GIB, shared=i in shared)
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
                with self.lock:
                    for launch in message.start:
                        self.running[launch.job_id] = launch
                    self.signals.extend(message.signal)
                    self.pty.extend(message.pty)
                    for stop in message.stop:
                        self.stops.append(stop)
                        if self.answer_stops:
                            self.running.pop(stop.job_id, None)
                            self._outbox.put(apb.AgentMessage(reports=[_stopped(stop)]))

    def _beat(self) -> None:
        while not self._closed.wait(0.2):
            with self.lock:
                launches = list(self.running.items())
            samples = [s for j, launch in launches if (s := self._sample(j, launch)) is not None]
            usage = [pb.GpuUsage(uuid=u, health="ok") for u in self.uuids]
            heartbeat = apb.Heartbeat(at=time.time(), usage=usage, jobs=samples)
            self._outbox.put(apb.AgentMessage(heartbeat=heartbeat))

    def _sample(self, job_id: int, launch: apb.JobLaunch) -> apb.JobSample | None:
        return self.sampler(job_id, launch) if self.sampler is not None else None

    def send(self, message: apb.AgentMessage) -> None:
        self._outbox.put(message)

    def attempt(self, job_id: int) -> int:
        with self.lock:
            return self.running[job_id].attempt

    def output(
        self, job_id: int, data: bytes, *, attempt: int | None = None, closed: bool = False
    ) -> apb.PtyOutput:
        """A job's terminal output (of its current start unless `attempt`), as sent."""
        entry = apb.PtyOutput(
            job_id=job_id,
            attempt=self.attempt(job_id) if attempt is None else attempt,
            data=data,
            closed=closed,
        )
        self.send(apb.AgentMessage(pty=[entry]))
        return entry

    def ended(
        self,
        job_id: int,
        exit_code: int = 0,
        signal: int | None = None,
        telemetry: pb.GpuTelemetry | None = None,
    ) -> apb.JobReport:
        """The job's end report (completed with 0, else failed; with what its GPUs did),
        not yet sent."""
        with self.lock:
            launch = self.running.pop(job_id)
        failed = exit_code != 0 or signal is not None
        return apb.JobReport(
            job_id=job_id,
            kind=apb.JobReport.ENDED,
            end_state="failed" if failed else "completed",
            result=pb.JobResult(
                exit_code=None if signal is not None else exit_code,
                signal=signal,
                reason=f"signal {signal}" if signal is not None else f"exit code {exit_code}",
            ),
            at=time.time(),
            attempt=launch.attempt,
            telemetry=telemetry,
        )

    def end(
        self,
        job_id: int,
        exit_code: int = 0,
        signal: int | None = None,
        telemetry: pb.GpuTelemetry | None = None,
    ) -> None:
        self.send(apb.AgentMessage(reports=[self.ended(job_id, exit_code, signal, telemetry)]))

    def pty_inputs(self, job_id: int) -> list[apb.PtyInput]:
        with self.lock:
            return [p for p in self.pty if p.job_id == job_id]

    def close(self) -> None:
        self._closed.set()
        self._outbox.put(None)
        self._stream.cancel()
        self._channel.close()
        for thread in self._threads:
            thread.join(5)


def _stopped(stop: apb.StopJob) -> apb.JobReport:
    return apb.JobReport(
        job_id=stop.job_id,
        kind=apb.JobReport.ENDED,
        end_state=stop.end_state,
        result=pb.JobResult(reason=stop.reason, signal=15),
        at=time.time(),
        attempt=stop.attempt,
    )
