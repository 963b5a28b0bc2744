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

The Client is the front; its parts: gpuq.client_connection (channels, credentials, which
address answers), gpuq.client_submit (the submission streams, and resending a submission that
got no answer), gpuq.client_attach (an interactive job's terminal), gpuq.client_errors (what
a gRPC status means: the coordinator's exception, no coordinator, or its store down).
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gpuq.client_attach import Attachment
from gpuq.client_connection import Connection
from gpuq.client_errors import STATUS_CODES, error_for, outcomes_of, unreachable
from gpuq.client_submit import Submissions
from gpuq.config.loading import load_settings
from gpuq.config.settings import Settings, split_addresses
from gpuq.domain.dependencies import parse_job_ref
from gpuq.domain.states import JobState, parse_states
from gpuq.errors import InvalidInput, NotFound
from gpuq.v1 import queue_pb2

if TYPE_CHECKING:
    from gpuq.domain.diagnosis import Diagnosis
    from gpuq.domain.model import Job, JobEvent, JobSpec
    from gpuq.v1 import types_pb2 as pb


class Client:
    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        settings: Settings | None = None,
        timeout: float = 30.0,
    ) -> None:
        settings = settings or load_settings()
        addresses = split_addresses(address or settings.client_address())
        self._connection = Connection(addresses, token, settings.token_file, settings.client.tls_ca)
        self.timeout = timeout
        self._connection.stub_at(0)
        self._submissions = Submissions(self._connection)

    def close(self) -> None:
        self._submissions.close()
        self._connection.close()

    @property
    def addresses(self) -> builtins.list[str]:
        """The coordinator addresses, in the order they are tried."""
        return self._connection.addresses

    @property
    def address(self) -> str:
        """The coordinator address in use (the one that answered last)."""
        return self._connection.address

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
        qos, env, output, error, array, after, hold, nice... (see gpuq.submission.build_spec);
        for a job on several nodes nodes, ntasks, ntasks_per_node, gpus_per_node,
        gpus_per_task, cpus_per_task, mem_per_gpu, mem_per_cpu, exclusive (mem=0: all of each
        node's memory), as sbatch reads them.
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
        result = self._submissions.submit(request, self.timeout)
        if result.code:
            code = STATUS_CODES.get(result.code, grpc.StatusCode.UNKNOWN)
            raise error_for(code, result.message, result.error_kind)
        return list(result.job_ids)

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

    def diagnose(self, job_id: int | str) -> Diagnosis:
        """Why the job ended as it did: ranked verdicts (`.verdict` is the first), each with
        its evidence and a next step (README "Why a job failed")."""
        from gpuq.convert import diagnosis_from_proto

        return diagnosis_from_proto(self.detail_reply(job_id, diagnose=True).diagnosis)

    def detail_reply(self, job_id: int | str, diagnose: bool = False) -> queue_pb2.JobDetail:
        """GetJob's whole answer: the job, its history and, for an array, its task counts;
        with its diagnosis when `diagnose`."""
        number, task = parse_job_ref(str(job_id))
        request = queue_pb2.GetJobRequest(job_id=number, task=task, diagnose=diagnose)
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
        page_size: int = 0,
    ) -> builtins.list[pb.Job]:
        """As `list`, on the wire. A live listing shows an array's waiting tasks as one
        entry (`array_tasks` set) unless `expand_arrays`. Filters (all given must match):
        `users` (any of), `names` (shell patterns, any of), `nodes` (any of), `since` and
        `until` (seconds since 1970: the end time of finished jobs, else the submit time).
        Every matching job (up to `limit`), asked a page at a time (`page_size`; 0: the
        coordinator's largest, [coordinator] list_page_size) until the last."""
        request = listing_request(
            states,
            user,
            finished,
            limit,
            job_ids,
            array_job_id,
            expand_arrays,
            users=users,
            names=names,
            nodes=nodes,
            since=since,
            until=until,
            page_size=page_size,
        )
        return builtins.list(self.pages(request))

    def pages(self, request: queue_pb2.ListJobsRequest) -> Iterator[pb.Job]:
        """The jobs of a ListJobs request, page after page to the listing's end."""
        while True:
            reply: queue_pb2.ListJobsReply = self._call("ListJobs", request)
            yield from reply.jobs
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    def nodes(self) -> builtins.list[queue_pb2.NodeInfo]:
        return list(self._call("ListNodes", queue_pb2.ListNodesRequest()).nodes)

    def nodes_and_listings(
        self, *requests: queue_pb2.ListJobsRequest
    ) -> tuple[builtins.list[queue_pb2.NodeInfo], builtins.list[builtins.list[pb.Job]]]:
        """`nodes()` and each listing (made by `listing_request`), asked at once: `gpuq status`
        waits about one round trip instead of four. A listing longer than a page goes on
        page by page afterwards."""
        calls: builtins.list[tuple[str, Any]] = [("ListNodes", queue_pb2.ListNodesRequest())]
        calls += [("ListJobs", request) for request in requests]
        replies = self._connection.call_together(calls, self.timeout)
        listings = []
        for request, reply in zip(requests, replies[1:], strict=True):
            jobs = builtins.list(reply.jobs)
            if reply.next_page_token:
                request.page_token = reply.next_page_token
                jobs += self.pages(request)
            listings.append(jobs)
        return builtins.list(replies[0].nodes), listings

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
        missing_ok: bool = False,
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        """Cancel the jobs named, or (with no ids) every live job matching all the filters
        given: `user` (another's needs an admin), `states` (e.g. ["PD"]), `name` (a shell
        pattern). One request, whatever the number of jobs. Each verb raises NotFound when
        a job named does not exist (the others named are acted on all the same) unless
        `missing_ok`: then that job's outcome says so (error_kind "not_found")."""
        return self._action(
            "Cancel", job_ids, reason, user=user, states=states, name=name, missing_ok=missing_ok
        )

    def hold(
        self,
        *job_ids: int | str,
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
        missing_ok: bool = False,
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        return self._action(
            "Hold", job_ids, user=user, states=states, name=name, missing_ok=missing_ok
        )

    def release(
        self,
        *job_ids: int | str,
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
        missing_ok: bool = False,
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        return self._action(
            "Release", job_ids, user=user, states=states, name=name, missing_ok=missing_ok
        )

    def requeue(
        self,
        *job_ids: int | str,
        hold: bool = False,
        user: str = "",
        states: Iterable[str] = (),
        name: str = "",
        missing_ok: bool = False,
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        """Back to the queue with the same ids: running jobs are stopped first, ended ones
        are queued again; `hold`: held instead of pending."""
        return self._action(
            "Requeue",
            job_ids,
            user=user,
            states=states,
            name=name,
            hold=hold,
            missing_ok=missing_ok,
        )

    def update(
        self, *job_ids: int | str, missing_ok: bool = False, **changes: Any
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        """Change waiting jobs: keyword arguments are UpdateRequest's fields (time_limit in
        seconds, qos, nice, hold, name, gpus, cpus, mem and gpu_mem in bytes, ...);
        `dependencies=[...]` (Dependency messages or dicts) replaces them, [] clears them;
        `begin_time=None` clears it; `nodelist`/`exclude` lists replace them."""
        request = queue_pb2.UpdateRequest(job_ids=checked_ids(job_ids))
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
        return outcomes_of(self._call("Update", request), missing_ok)

    def fail_job(self, job_id: int, reason: str, attempt: int = 0) -> queue_pb2.ActionOutcome:
        """End a running job of yours as failed, on every node, with `reason` (what srun does
        when a task of a step fails: SLURM's KillOnBadExit). `attempt`: the start it is
        about (GPUQ_ATTEMPT in the job; 0: the current one)."""
        request = queue_pb2.FailJobRequest(job_id=job_id, attempt=attempt, reason=reason)
        outcome: queue_pb2.ActionOutcome = self._call("FailJob", request).outcomes[0]
        return outcome

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
        missing_ok: bool = False,
    ) -> builtins.list[queue_pb2.ActionOutcome]:
        request = queue_pb2.JobSelection(
            job_ids=checked_ids(job_ids),
            reason=reason,
            user=user,
            states=list(states),
            name=name,
            hold=hold,
        )
        return outcomes_of(self._call(method, request), missing_ok)

    def watch(
        self, job_ids: Iterable[int] = (), timeout: float | None = None
    ) -> Iterator[JobEvent]:
        """Job events as they happen; ends when every watched job has finished."""
        from gpuq.convert import event_from_proto

        job_ids = list(job_ids)
        connection = self._connection
        start, count = connection.current, len(connection.addresses)
        for attempt in range(count):
            index = (start + attempt) % count
            stream = connection.stub_at(index).Watch(
                queue_pb2.WatchRequest(job_ids=job_ids),
                metadata=connection.metadata(index),
                timeout=timeout,
            )
            answered = False
            try:
                for batch in stream:
                    if not answered:
                        answered, connection.current = True, index
                    for event in batch.events:
                        yield event_from_proto(event)
                return
            except grpc.RpcError as error:
                if not answered and attempt + 1 < count and unreachable(error):
                    connection.unreachable_at(index)
                    continue
                if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise connection.translate(error) from None
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
        connection = self._connection
        index = connection.current
        stub, metadata = connection.stub_at(index), connection.metadata(index)
        return Attachment(stub, metadata, job_id, connection.where)

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

    def advice(self, user: str | None = None, since: float | None = None) -> queue_pb2.ReportReply:
        """gpuq report --advice: the usage rows, `user`'s (default: the caller's) right-sizing
        advice per job name over their ended jobs (since `since`, default the last 30 days),
        and the users whose GPUs sat idle."""
        request = queue_pb2.ReportRequest(user=user or "", since=since, advice=True)
        reply: queue_pb2.ReportReply = self._call("Report", request)
        return reply

    def efficiency(self, job_id: int) -> queue_pb2.JobEfficiency:
        """gpuq eff: what job `job_id` asked for against what it used (so far, if it runs)."""
        if not 1 <= job_id < 2**63:
            raise NotFound(f"no job {job_id}")
        reply: queue_pb2.ReportReply = self._call("Report", queue_pb2.ReportRequest(job_id=job_id))
        return reply.efficiency

    def web_login(self) -> queue_pb2.WebLoginReply:
        """A one-time link (valid for a minute, once) that signs the caller in to the web
        dashboard (gpuq web); Unsatisfiable when the coordinator serves no dashboard."""
        reply: queue_pb2.WebLoginReply = self._call("WebLogin", queue_pb2.WebLoginRequest())
        return reply

    # ---- plumbing --------------------------------------------------------------------------

    def call_metadata(self, index: int | None = None) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: who calls (gpuq.identity)."""
        connection = self._connection
        return connection.metadata(connection.current if index is None else index)

    def _call(self, method: str, request: Any) -> Any:
        """The reply from the address that answered last, or else from the first of the
        others that answers (each tried once)."""
        return self._connection.call(method, request, self.timeout)


def listing_request(
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
    page_size: int = 0,
) -> queue_pb2.ListJobsRequest:
    """The ListJobs request of `list_raw`'s arguments, checked (InvalidInput)."""
    if isinstance(states, str):
        states = [states]
    if not 0 <= limit <= 1_000_000:
        raise InvalidInput("limit", limit, "must be from 0 (no limit) to 1000000")
    if not 0 <= page_size < 2**32:
        raise InvalidInput("page_size", page_size, "must be from 0 (the largest) up")
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
        page_size=page_size,
    )
    return request


def split_target(target: str) -> tuple[str, str]:
    """`NODE` or `NODE:GPU` -> (node, gpu or "")."""
    node, _, gpu = str(target).strip().partition(":")
    if not node or (":" in str(target) and not gpu):
        raise InvalidInput("NODE[:GPU]", target, "expected a node, or NODE:GPU (index or UUID)")
    return node, gpu


def checked_ids(job_ids: Iterable[object]) -> builtins.list[str]:
    """The ids an action names, as the request carries them; a malformed one raises
    InvalidInput before anything is sent (as the CLI does), so that no job is acted on: the
    coordinator would refuse it alone and act on the others."""
    checked = []
    for job_id in job_ids:
        if isinstance(job_id, bool) or not isinstance(job_id, (int, str)):
            raise InvalidInput("job id", job_id, "expected 42 or '42_3' (name several as *ids)")
        parse_job_ref(str(job_id))
        checked.append(str(job_id))
    return checked
