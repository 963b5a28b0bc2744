"""`gpuq.Client`: the Python API, and what the CLI uses underneath.

    import gpuq
    client = gpuq.Client()                      # finds `gpuq serve` like the CLI does
    job_id = client.submit(wrap="python train.py", gpus=2, mem="40G")
    job = client.wait(job_id)                   # the finished Job; job.result.exit_code
    print(client.logs(job_id))

Errors come back as the exceptions the coordinator raised (InvalidInput, NotFound, ...); a
coordinator that cannot be reached raises ServerUnavailable saying how to start one.

The address may name several coordinators, comma-separated (a leader and its standbys on one
PostgreSQL store): a call goes to the one that answered last (at first, the first one), and
one that finds it unreachable (UNAVAILABLE) tries the next, so a standby that took over is
found without a restart.
"""

from __future__ import annotations

import builtins
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gpuq.config.loading import load_settings
from gpuq.config.settings import Settings, auth_socket_for, split_addresses
from gpuq.domain.dependencies import parse_job_ref
from gpuq.domain.states import JobState, parse_states
from gpuq.errors import (
    Conflict,
    GpuqError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    ServerUnavailable,
    StorageUnavailable,
    Unsatisfiable,
)
from gpuq.identity import (
    METADATA_KEY,
    credential_expiry,
    fetch_credential,
    read_user_token,
)
from gpuq.tls import client_channel
from gpuq.v1 import queue_pb2, queue_pb2_grpc

if TYPE_CHECKING:
    from gpuq.domain.model import Job, JobEvent, JobSpec
    from gpuq.v1 import types_pb2 as pb

STORAGE_PREFIX = "storage unavailable: "  # gpuq.coordinator.front.rpc_calls says it so
HOW_TO_START = "start it with `gpuq serve` (or `systemctl start gpuq-coordinator` on a server)"
# a submission that got no answer is sent again (with its request key, so it is not a second
# job) after each of these pauses, in seconds, before ServerUnavailable is raised
SUBMIT_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class Client:
    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        settings: Settings | None = None,
        timeout: float = 30.0,
    ) -> None:
        settings = settings or load_settings()
        self.addresses = split_addresses(address or settings.coordinator_address)
        self._current = 0  # the address that answered last
        self._token = token  # a per-user token for TCP; None: read from the token file
        self._token_file = settings.token_file
        # each Unix socket address's credential (gpuq.identity), until shortly before it expires
        self._credentials: dict[str, str] = {}
        self.timeout = timeout
        self._tls_ca = settings.client.tls_ca  # verifies the coordinator over TCP (gpuq.tls)
        self._channels: builtins.list[grpc.Channel | None] = [None] * len(self.addresses)
        self._stubs: builtins.list[queue_pb2_grpc.QueueStub | None] = [None] * len(self.addresses)
        self._channels_lock = threading.Lock()
        self._stub_at(0)
        self._streams = threading.local()  # each thread's open Submit stream
        # every thread's, to close with the client; weak: a thread's stream ends with the thread
        self._open: weakref.WeakSet[_SubmitStream] = weakref.WeakSet()
        self._open_lock = threading.Lock()

    def close(self) -> None:
        with self._open_lock:
            streams, self._open = list(self._open), weakref.WeakSet()
        for stream in streams:
            stream.close()
        with self._channels_lock:
            for channel in self._channels:
                if channel is not None:
                    channel.close()

    @property
    def address(self) -> str:
        """The coordinator address in use (the one that answered last)."""
        return self.addresses[self._current]

    @property
    def _where(self) -> str:
        """All the addresses, for messages."""
        return ", ".join(self.addresses)

    def _stub_at(self, index: int) -> queue_pb2_grpc.QueueStub:
        stub = self._stubs[index]
        if stub is None:
            with self._channels_lock:
                stub = self._stubs[index]
                if stub is None:
                    # TLS for HOST:PORT when [client] tls_ca is set; a Unix socket never
                    channel = client_channel(
                        self.addresses[index],
                        self._tls_ca,
                        [("grpc.max_receive_message_length", 256 << 20)],
                    )
                    self._channels[index] = channel
                    stub = self._stubs[index] = queue_pb2_grpc.QueueStub(channel)
        return stub

    def _unreachable_at(self, index: int) -> None:
        """The address `index` did not answer: the next call starts at the one after it
        (unless another thread has moved on already)."""
        if self._current == index:
            self._current = (index + 1) % len(self.addresses)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- submitting ------------------------------------------------------------------------

    def submit(
        self,
        script: str | Path | None = None,
        *args: str,
        request_key: str | None = None,
        **options: Any,
    ) -> int:
        """Submit a script (or `wrap="CMD"`) with sbatch-like options; the job (or array) id.

        Options are those of `gpuq submit`: gpus, gpu_mem, gpu_share, cpus, mem, time, name,
        qos, env, output, error, array, after, hold, nice... (see gpuq.submission.build_spec).
        `request_key`: see submit_spec.
        """
        from gpuq.submission import build_spec

        spec = build_spec(script=str(script) if script else None, args=args, **options)
        return self.submit_spec(spec, request_key=request_key)[0]

    def submit_spec(self, spec: JobSpec, request_key: str | None = None) -> builtins.list[int]:
        """Submit a ready JobSpec; one id per job (per task for an array).

        It goes over this thread's open submission stream (a message costs both sides much
        less than a call); the errors are those of a call.

        The request carries a key (`request_key`, at most 64 printable ASCII characters, or
        a random one): when no answer came (the coordinator was unreachable, restarted, or too
        slow) the same request is sent again a few times, and the coordinator answers a repeat
        of a key with the first request's ids instead of making a second job. The same key
        given again later (within a day) also gets those ids."""
        from gpuq.convert import spec_to_proto

        request = queue_pb2.SubmitRequest(
            spec=spec_to_proto(spec), request_key=request_key or uuid.uuid4().hex
        )
        result = self._submit_until_answered(request)
        if result.code:
            raise _error_for(_CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)
        return list(result.job_ids)

    def _submit_until_answered(self, request: queue_pb2.SubmitRequest) -> queue_pb2.SubmitResult:
        """The coordinator's answer; the request is sent again (on a new stream) while none
        comes, after each of SUBMIT_RETRY_DELAYS. An answer, an error included, is final.
        With several addresses, an unreachable one passes the request to the next at once;
        the pause comes when each has been tried."""
        delays = iter((*SUBMIT_RETRY_DELAYS, None))
        delay = next(delays)
        others = len(self.addresses) - 1  # to try before the next pause
        while True:
            stream = self._submit_stream()
            try:
                result = stream.submit(request)
            except grpc.RpcError as error:
                self._drop(stream)
                if not _transient(error):
                    raise _translate(error, self._where, self._tls_ca is not None) from None
                if others and _unreachable(error):
                    others -= 1
                    self._unreachable_at(stream.index)
                    continue
                if delay is None:
                    code = error.code()
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise ServerUnavailable(
                            f"the gpuq coordinator at {self.address} did not answer the "
                            f"submission in {self.timeout:g} s ({len(SUBMIT_RETRY_DELAYS) + 1} "
                            "tries)"
                        ) from None
                    raise _translate(error, self._where, self._tls_ca is not None) from None
                if _unreachable(error):
                    self._unreachable_at(stream.index)  # the next round starts at the next
            else:
                if result is not None:
                    self._current = stream.index
                    return result
                self._drop(stream)
                if delay is None:
                    raise ServerUnavailable(
                        f"the gpuq coordinator at {self.address} ended the submission stream "
                        f"without an answer ({len(SUBMIT_RETRY_DELAYS) + 1} tries)"
                    )
            time.sleep(delay)
            delay = next(delays)
            others = len(self.addresses) - 1

    def _submit_stream(self) -> _SubmitStream:
        stream: _SubmitStream | None = getattr(self._streams, "current", None)
        if stream is not None and stream.stale():
            self._drop(stream)
            stream = None
        if stream is None:
            index = self._current
            stream = _SubmitStream(self._stub_at(index), self._metadata(index), self.timeout)
            stream.index = index
            self._streams.current = stream
            with self._open_lock:
                self._open.add(stream)
        return stream

    def _drop(self, stream: _SubmitStream) -> None:
        """End the stream (a broken one too: that stops the thread feeding it)."""
        stream.close()
        self._streams.current = None
        with self._open_lock:
            self._open.discard(stream)

    # ---- reading ---------------------------------------------------------------------------

    def get(self, job_id: int | str) -> Job:
        """A job by id, `"40_3"` for task 3 of array 40 (an array's id gives its record)."""
        from gpuq.convert import job_from_proto

        return job_from_proto(self.detail_reply(job_id).job)

    def detail(self, job_id: int | str) -> tuple[pb.Job, list[JobEvent]]:
        """The job as the wire has it (with output paths and pending reasons) and its history."""
        return self.detail_from(self.detail_reply(job_id))

    @staticmethod
    def detail_from(reply: queue_pb2.JobDetail) -> tuple[pb.Job, list[JobEvent]]:
        from gpuq.convert import event_from_proto

        return reply.job, [event_from_proto(e) for e in reply.events]

    def array_states(self, array_job_id: int | str) -> dict[str, int]:
        """How many tasks of the array are in each state."""
        return dict(self.detail_reply(array_job_id).array_states)

    def detail_reply(self, job_id: int | str) -> queue_pb2.JobDetail:
        """GetJob's whole answer: the job, its history and, for an array, its task counts."""
        number, task = parse_job_ref(str(job_id))
        request = queue_pb2.GetJobRequest(job_id=number, task=task)
        detail: queue_pb2.JobDetail = self._call("GetJob", request)
        return detail

    def list(
        self,
        states: Iterable[JobState | str] = (),
        user: str | None = None,
        finished: bool = False,
        limit: int = 0,
        job_ids: Iterable[int] = (),
    ) -> builtins.list[Job]:
        """Jobs without their environment (`get` has it); live ones unless finished=True."""
        from gpuq.convert import job_from_proto

        return [job_from_proto(j) for j in self.list_raw(states, user, finished, limit, job_ids)]

    def list_raw(
        self,
        states: Iterable[JobState | str] = (),
        user: str | None = None,
        finished: bool = False,
        limit: int = 0,
        job_ids: Iterable[int] = (),
        array_job_id: int | None = None,
        expand_arrays: bool = False,
        *,
        users: Iterable[str] = (),
        names: Iterable[str] = (),
        nodes: Iterable[str] = (),
        since: float | None = None,
        until: float | None = None,
    ) -> builtins.list[pb.Job]:
        """As `list`, on the wire. A live listing shows an array's waiting tasks as one
        entry (`array_tasks` set) unless `expand_arrays`. Filters (all given must match):
        `users` (any of), `names` (shell patterns, any of), `nodes` (any of), `since` and
        `until` (seconds since 1970: the end time of finished jobs, else the submit time)."""
        if isinstance(states, str):
            states = [states]
        if not 0 <= limit <= 1_000_000:
            raise InvalidInput("limit", limit, "must be from 0 (no limit) to 1000000")
        job_ids = [parse_job_ref(str(i))[0] for i in job_ids]
        request = queue_pb2.ListJobsRequest(
            states=sorted(s.value for s in parse_states(str(s) for s in states)),
            expand_arrays=expand_arrays,
            user=user or "",
            finished=finished,
            limit=limit,
            job_ids=list(job_ids),
            array_job_id=array_job_id,
            users=list(users),
            names=list(names),
            nodes=list(nodes),
            since=since,
            until=until,
        )
        return list(self._call("ListJobs", request).jobs)

    def nodes(self) -> builtins.list[queue_pb2.NodeInfo]:
        return list(self._call("ListNodes", queue_pb2.ListNodesRequest()).nodes)

    # ---- admins ----------------------------------------------------------------------------

    def drain(self, target: str, reason: str) -> queue_pb2.DrainReply:
        """Take `NODE` or `NODE:GPU` (an index as `gpuq nodes` shows it, or a GPU or MIG
        UUID) out of service: no new work goes there, running jobs continue. NotFound for
        an unknown node or GPU."""
        node, gpu = split_target(target)
        request = queue_pb2.DrainRequest(node=node, gpu=gpu, reason=reason)
        reply: queue_pb2.DrainReply = self._call("Drain", request)
        return reply

    def resume(self, target: str) -> queue_pb2.DrainReply:
        """Undo a drain of `NODE` or `NODE:GPU`; the reply's message says when a GPU stays
        out of service because its agent reports it unhealthy or dirty."""
        node, gpu = split_target(target)
        reply: queue_pb2.DrainReply = self._call(
            "Resume", queue_pb2.DrainRequest(node=node, gpu=gpu)
        )
        return reply

    # ---- acting ----------------------------------------------------------------------------

    def cancel(
        self,
        *job_ids: int | str,
        reason: str = "",
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        """Cancel the jobs named, or (with no ids) every live job matching all the filters
        given: `user` (another's needs an admin), `states` (e.g. ["PD"]), `name` (a shell
        pattern). One request, whatever the number of jobs."""
        return self._action("Cancel", job_ids, reason, user=user, states=states, name=name)

    def hold(
        self, *job_ids: int | str, user: str = "", states: Iterable[str] = (), name: str = ""
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        return self._action("Hold", job_ids, user=user, states=states, name=name)

    def release(
        self, *job_ids: int | str, user: str = "", states: Iterable[str] = (), name: str = ""
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        return self._action("Release", job_ids, user=user, states=states, name=name)

    def requeue(
        self,
        *job_ids: int | str,
        hold: bool = False,
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        """Back to the queue with the same ids: running jobs are stopped first, ended ones
        are queued again; `hold`: held instead of pending."""
        return self._action("Requeue", job_ids, user=user, states=states, name=name, hold=hold)

    def update(self, *job_ids: int | str, **changes: Any) -> builtins.list[queue_pb2.ActionOutcome]:
        """Change waiting jobs: keyword arguments are UpdateRequest's fields (time_limit in
        seconds, qos, nice, hold, name, gpus, cpus, mem and gpu_mem in bytes, ...);
        `dependencies=[...]` (Dependency messages or dicts) replaces them, [] clears them;
        `begin_time=None` clears it; `nodelist`/`exclude` lists replace them."""
        request = queue_pb2.UpdateRequest(job_ids=[str(j) for j in job_ids])
        for key, value in changes.items():
            if key in ("dependencies", "begin_time", "nodelist", "exclude"):
                setattr(request, f"set_{key}", True)
                if value is None:
                    continue
                if key == "begin_time":
                    request.begin_time = value
                else:
                    getattr(request, key).extend(value)
            else:
                setattr(request, key, value)
        return list(self._call("Update", request).outcomes)

    def _action(
        self,
        method: str,
        job_ids: tuple[int | str, ...],
        reason: str = "",
        *,
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
        hold: bool = False,
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        request = queue_pb2.JobSelection(
            job_ids=[str(j) for j in job_ids],
            reason=reason,
            user=user,
            states=list(states),
            name=name,
            hold=hold,
        )
        return list(self._call(method, request).outcomes)

    def watch(
        self, job_ids: Iterable[int] = (), timeout: float | None = None
    ) -> Iterator[JobEvent]:
        """Job events as they happen; ends when every watched job has finished."""
        from gpuq.convert import event_from_proto

        job_ids = list(job_ids)
        start, count = self._current, len(self.addresses)
        for attempt in range(count):
            index = (start + attempt) % count
            stream = self._stub_at(index).Watch(
                queue_pb2.WatchRequest(job_ids=job_ids),
                metadata=self._metadata(index),
                timeout=timeout,
            )
            answered = False
            try:
                for batch in stream:
                    if not answered:
                        answered, self._current = True, index
                    for event in batch.events:
                        yield event_from_proto(event)
                return
            except grpc.RpcError as error:
                if not answered and attempt + 1 < count and _unreachable(error):
                    self._unreachable_at(index)
                    continue
                if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise _translate(error, self._where, self._tls_ca is not None) from None
                raise TimeoutError(f"jobs {job_ids} did not finish in time") from None

    def wait(self, job_id: int | str, timeout: float | None = None) -> Job:
        """Block until the job (every task, for an array id) has finished; the job (for an
        array, its record: `array_states` counts how its tasks ended)."""
        job = self.get(job_id)
        for _ in self.watch([job.id], timeout=timeout):
            pass
        return self.get(job.id)

    def logs(self, job_id: int | str, stream: str = "stdout") -> str:
        """What the job wrote so far (read from its output file, as on a shared filesystem)."""
        path = self.output_path(job_id, stream)
        try:
            return Path(path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def output_path(self, job_id: int | str, stream: str = "stdout") -> str:
        job = self.detail_reply(job_id).job
        return job.stdout_path if stream == "stdout" else job.stderr_path

    def attach(self, job_id: int) -> Attachment:
        """The terminal of an interactive job of ours (gpuq run, gpuq alloc): send input,
        window sizes and signals on it, and iterate its replies (state changes, output, and
        last the end). Closing it before the job ended cancels the job."""
        index = self._current
        return Attachment(self._stub_at(index), self._metadata(index), job_id, self._where)

    # ---- recurring jobs --------------------------------------------------------------------

    def add_cron(self, schedule: str, spec: JobSpec) -> queue_pb2.CronEntry:
        """Submit `spec` at every time `schedule` (five cron fields) names."""
        from gpuq.convert import spec_to_proto

        request = queue_pb2.AddCronRequest(schedule=schedule, spec=spec_to_proto(spec))
        entry: queue_pb2.CronEntry = self._call("AddCron", request)
        return entry

    def cron_entries(self) -> builtins.list[queue_pb2.CronEntry]:
        return builtins.list(self._call("ListCron", queue_pb2.ListCronRequest()).entries)

    def remove_cron(self, entry_id: int) -> queue_pb2.CronEntry:
        if not 1 <= entry_id < 2**63:
            raise InvalidInput("cron entry", entry_id, "no such entry: the number is out of range")
        entry: queue_pb2.CronEntry = self._call(
            "RemoveCron", queue_pb2.RemoveCronRequest(id=entry_id)
        )
        return entry

    def issue_token(self, user: str) -> str:
        """A new per-user token for `user` (admins only), for calls over TCP."""
        reply: queue_pb2.TokenReply = self._call("IssueToken", queue_pb2.TokenRequest(user=user))
        return reply.token

    def revoke_tokens(self, user: str) -> int:
        """Revoke every token of `user` (admins only); how many there were."""
        reply: queue_pb2.TokenReply = self._call("RevokeTokens", queue_pb2.TokenRequest(user=user))
        return reply.revoked

    def report(
        self, user: str | None = None, since: float | None = None
    ) -> builtins.list[queue_pb2.ReportRow]:
        """Usage per user over the jobs that ran and ended (at or after `since`): GPU-seconds,
        energy (joules) and GPU-second-weighted mean utilisation (gpuq report)."""
        request = queue_pb2.ReportRequest(user=user or "", since=since)
        reply: queue_pb2.ReportReply = self._call("Report", request)
        return builtins.list(reply.rows)

    def web_login(self) -> queue_pb2.WebLoginReply:
        """A one-time link (valid for a minute, once) that signs the caller in to the web
        dashboard (gpuq web); Unsatisfiable when the coordinator serves no dashboard."""
        reply: queue_pb2.WebLoginReply = self._call("WebLogin", queue_pb2.WebLoginRequest())
        return reply

    # ---- plumbing --------------------------------------------------------------------------

    def call_metadata(self, index: int | None = None) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: who calls (gpuq.identity)."""
        return self._metadata(self._current if index is None else index)

    def _metadata(self, index: int) -> tuple[tuple[str, str], ...]:
        """On a Unix socket, a credential from the coordinator's handshake socket (the kernel
        tells it our uid); over TCP, this user's token."""
        address = self.addresses[index]
        if address.startswith("unix:"):
            credential = self._credentials.get(address)
            if credential is None or credential_expiry(credential) < time.time() + 60:
                socket_path = Path(address.removeprefix("unix:").removeprefix("//"))
                credential = fetch_credential(auth_socket_for(socket_path))
                self._credentials[address] = credential
            return ((METADATA_KEY, f"Bearer {credential}"),)
        if self._token is None:
            self._token = read_user_token(self._token_file)
        return ((METADATA_KEY, f"Token {self._token}"),)

    def _call(self, method: str, request: Any) -> Any:
        """The reply from the address that answered last, or else from the first of the
        others that answers (each tried once)."""
        start, count = self._current, len(self.addresses)
        for attempt in range(count):
            index = (start + attempt) % count
            try:
                metadata = self._metadata(index)
            except ServerUnavailable:
                if attempt + 1 < count:
                    self._unreachable_at(index)
                    continue
                raise
            try:
                reply = getattr(self._stub_at(index), method)(
                    request, metadata=metadata, timeout=self.timeout
                )
            except grpc.RpcError as error:
                if attempt + 1 < count and _unreachable(error):
                    self._unreachable_at(index)
                    continue
                raise _translate(error, self._where, self._tls_ca is not None) from None
            if index != start:
                self._current = index
            return reply
        raise AssertionError("unreachable")  # pragma: no cover


class _SubmitStream:
    """One open Submit stream, used by one thread: a request in, its result out.

    The call has a deadline of `timeout` and is replaced once half of that has passed, so a
    submission on it has between timeout/2 and timeout to finish, as a call of its own would."""

    index = 0  # which of the client's addresses it goes to

    def __init__(
        self, stub: queue_pb2_grpc.QueueStub, metadata: tuple[Any, ...], timeout: float | None
    ) -> None:
        self._requests: queue.SimpleQueue[queue_pb2.SubmitRequest | None] = queue.SimpleQueue()
        self._results = stub.Submit(
            iter(self._requests.get, None), metadata=metadata, timeout=timeout
        )
        self._replace_at = time.monotonic() + timeout / 2 if timeout is not None else None
        # the end of the requests ends the call (and gRPC's thread that feeds it): on close(),
        # or when the stream is dropped with the thread that used it
        self._end = weakref.finalize(self, self._requests.put, None)

    def stale(self) -> bool:
        """Past half its deadline, or already over (the coordinator restarted since): a request
        sent on it now would fail without having been seen, so a new stream takes it."""
        if self._results.done():
            return True
        return self._replace_at is not None and time.monotonic() >= self._replace_at

    def submit(self, request: queue_pb2.SubmitRequest) -> queue_pb2.SubmitResult | None:
        """Its result; None when the stream ended instead (grpc.RpcError when it failed)."""
        self._requests.put(request)
        result: queue_pb2.SubmitResult | None = next(self._results, None)
        return result

    def close(self) -> None:
        self._end()


class Attachment:
    """One open Attach stream. The send methods may be called from any thread (and from a
    signal handler: they only queue); the replies are read by one thread."""

    def __init__(
        self,
        stub: queue_pb2_grpc.QueueStub,
        metadata: tuple[Any, ...],
        job_id: int,
        where: str = "",
    ) -> None:
        self.job_id = job_id
        self._where = where
        self._requests: queue.SimpleQueue[queue_pb2.AttachRequest | None] = queue.SimpleQueue()
        self._requests.put(queue_pb2.AttachRequest(job_id=job_id))
        self._replies = stub.Attach(iter(self._requests.get, None), metadata=metadata)

    def send(self, data: bytes) -> None:
        """Input for the job's terminal (cut into pieces the coordinator takes)."""
        for start in range(0, len(data), ATTACH_CHUNK):
            self._requests.put(queue_pb2.AttachRequest(input=data[start : start + ATTACH_CHUNK]))

    def resize(self, rows: int, cols: int) -> None:
        if 1 <= rows <= 65535 and 1 <= cols <= 65535:
            self._requests.put(queue_pb2.AttachRequest(rows=rows, cols=cols))

    def signal(self, number: int) -> None:
        self._requests.put(queue_pb2.AttachRequest(signal=number))

    def eof(self) -> None:
        self._requests.put(queue_pb2.AttachRequest(eof=True))

    def replies(self) -> Iterator[queue_pb2.AttachReply]:
        """The coordinator's replies until the last (`ended`); GpuqError when the stream
        fails (a refusal, or the coordinator went away)."""
        try:
            yield from self._replies
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and self._replies.cancelled():
                return  # we closed it
            raise _translate(error, self._where) from None

    def close(self) -> None:
        """End the stream (the job is cancelled if it has not ended)."""
        self._requests.put(None)
        self._replies.cancel()


ATTACH_CHUNK = 16 << 10  # bytes of input in one AttachRequest (the coordinator takes 64 KiB)
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_ERRORS: dict[grpc.StatusCode, type[GpuqError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
}


def split_target(target: str) -> tuple[str, str]:
    """`NODE` or `NODE:GPU` -> (node, gpu or "")."""
    node, _, gpu = str(target).strip().partition(":")
    if not node or (":" in str(target) and not gpu):
        raise InvalidInput("NODE[:GPU]", target, "expected a node, or NODE:GPU (index or UUID)")
    return node, gpu


def _transient(error: grpc.RpcError) -> bool:
    """No answer came (the request may or may not have been seen): sending it again with its
    key is safe. A storage error is an answer (the coordinator said it, and saved nothing)."""
    details = error.details() or ""
    return error.code() in _TRANSIENT and not details.startswith(STORAGE_PREFIX)


def _unreachable(error: grpc.RpcError) -> bool:
    """No coordinator answered at that address (down, or a standby not leading yet)."""
    details = error.details() or ""
    return error.code() == grpc.StatusCode.UNAVAILABLE and not details.startswith(STORAGE_PREFIX)


def _translate(error: grpc.RpcError, address: str, tls_on: bool = False) -> GpuqError:
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and not details.startswith(STORAGE_PREFIX):
        from gpuq.tls import explain_unavailable

        tls_problem = explain_unavailable(details, tls_on=tls_on)
        if tls_problem is not None:
            return ServerUnavailable(f"cannot talk to the coordinator at {address}: {tls_problem}")
        return ServerUnavailable(f"no gpuq coordinator at {address}; {HOW_TO_START}")
    return _error_for(code, details)


def _error_for(code: grpc.StatusCode, details: str) -> GpuqError:
    """The exception the coordinator raised, from the status code it was mapped to."""
    if code == grpc.StatusCode.UNAVAILABLE and details.startswith(STORAGE_PREFIX):
        return StorageUnavailable(details[len(STORAGE_PREFIX) :] + "; retry later")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _from_message(InvalidInput, details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        kind = IllegalTransition if "cannot go from" in details else Unsatisfiable
        return _from_message(kind, details)
    return _from_message(_ERRORS.get(code, GpuqError), details or code.name)


def _from_message(kind: type[GpuqError], message: str) -> GpuqError:
    """The coordinator's exception type with its message (the fields stay server-side)."""
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    return error
