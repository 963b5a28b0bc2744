"""Every RPC, fuzzed (issue 11): requests built from the protobuf descriptors with random and
boundary values (proto_strategies), hand-written edge cases per RPC, and hostile
authorization metadata, against one real coordinator. Each call ends OK or with a clean
status (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, ...), never INTERNAL or UNKNOWN, and
with one line of details; afterwards the coordinator still runs jobs.

GPUQ_FUZZ_EXAMPLES sets the examples per fuzzed test (for a long run); `pytest -s` shows the
statuses seen per RPC at the end of the module.

No fuzzed job ever runs: the coordinator has no agent while it is fuzzed (the fuzzer's own
AgentLink streams only pretend to be nodes), and before a real agent starts every job is
cancelled and every cron entry removed. Fuzzed scripts also start with `exit 0`."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import grpc
import pytest
from e2e_cluster import Cluster, wait_for
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from proto_strategies import messages, strings

from gpuq.config.loading import load_settings
from gpuq.domain.states import JobState
from gpuq.identity import create_key_file, node_metadata
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc, queue_pb2, queue_pb2_grpc
from gpuq.v1 import types_pb2 as pb

EXAMPLES = int(os.environ.get("GPUQ_FUZZ_EXAMPLES", "12"))
# set (to anything): an unclean outcome is recorded, not raised, so that a long run goes on
# and finds every kind; the last test still fails on them, and -s lists them
KEEP_GOING = bool(os.environ.get("GPUQ_FUZZ_KEEP_GOING"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
MAX_REQUEST = 4_000_000  # bytes; the server's default limit is 4 MiB
CALL_TIMEOUT = 30.0
STREAM_TIMEOUT = 1.0  # Watch and Connect: DEADLINE_EXCEEDED is a clean end for them

C = grpc.StatusCode
CLEAN = {
    C.OK,
    C.INVALID_ARGUMENT,
    C.NOT_FOUND,
    C.PERMISSION_DENIED,
    C.UNAUTHENTICATED,
    C.FAILED_PRECONDITION,
    C.ALREADY_EXISTS,
    C.RESOURCE_EXHAUSTED,
    C.OUT_OF_RANGE,
}
STREAMING = {"Watch", "Connect"}
SAFE_SCRIPT = "#!/bin/sh\nexit 0\n"
FUZZ_NODES = ("fz1", "fz2", "fz3", "fz4")

# statuses seen, per RPC ("Submit/result" counts the per-submission codes of Submit streams)
SEEN: defaultdict[str, Counter[str]] = defaultdict(Counter)
# every kind of unclean outcome (RPC, problem, details): how often, and the smallest request
BAD: dict[tuple[str, str, str], list[Any]] = {}

UUIDS = [f"GPU-fz{i}-0000-0000-0000-00000000000{i}" for i in range(4)]
HINTS: dict[str, Sequence[Any]] = {
    "job_ids": [
        "1",
        "2",
        "1_0",
        "2_1",
        "0",
        "-1",
        "18446744073709551615",
        "18446744073709551616",
        "1_4294967295",
        "1_4294967296",
        "1_",
        "_1",
        "1__2",
        " 1",
        "\uff11",
        "1.0",
        "0x1",
        "1e3",
        "99999999999999999999999999",
    ],
    "job_id": list(range(1, 40)),
    "id": list(range(1, 10)),
    "task": [0, 1, 2, 3],
    "states": [s.value for s in JobState] + ["PD", "R", "CD", "bogus", "PENDING"],
    "user": ["root", "nobody", "daemon", "nosuchuser", "root\n", "0"],
    "node": [*FUZZ_NODES, "fzdrain", "nosuch", "."],
    "gpu": ["0", "1", "3", "-1", "99", "4294967296", *UUIDS, "MIG-x"],
    "reason": ["maintenance", "fan"],
    "schedule": [
        "* * * * *",
        "0 0 * * *",
        "*/5 * * * *",
        "0 0 31 2 *",
        "60 * * * *",
        "*/0 * * * *",
        "@hourly",
        "@reboot",
        "* * * *",
        "* * * * * *",
        "0-59 0-23 1-31 1-12 0-7",
        "1,2,3 * * * MON",
        "99999999999999999999 * * * *",
        "0 0 29 2 *",
        "5-1 * * * *",
    ],
    "kind": ["ok", "any", "notok", "afterok"],
    "qos": ["normal", "high", "low", "nope"],
    "mig": ["1g.10gb", "3g.71gb", "7g.80gb"],
    "workdir": ["/tmp", "relative", "/nonexistent/dir", "/"],
    "output": ["out-%j.txt", "/dev/null", "%x-%a.out", "%", "%%j"],
    "end_state": [s.value for s in JobState] + ["bogus"],
    "name": ["job", "a.b-c"],
    "source": ["--wrap", "/tmp/x.sh"],
    "uuid": UUIDS,
    "a": UUIDS,
    "b": UUIDS,
    "parent_uuid": UUIDS,
    "health": ["ok", "unhealthy", "dirty", "drained"],
    "mig_profile": ["1g.10gb", "3g.71gb"],
    "isolation": ["devices cgroup v1", "advisory: fuzz"],
    "driver": ["fake (4xA100-80GB)", "550.54"],
    "version": ["0.1.0", "99.0"],
    "at": [time.time(), time.time() + 3600.0, time.time() - 86400.0],
    "begin_time": [time.time() + 60.0, time.time() - 60.0],
    "memory": [80 * 2**30, 0],
}
GOOD_SPEC = pb.JobSpec(name="fz", script=SAFE_SCRIPT, workdir="/tmp")


def spec_strategy() -> st.SearchStrategy[pb.JobSpec]:
    def merged(spec: Any) -> pb.JobSpec:
        out = pb.JobSpec()
        out.CopyFrom(GOOD_SPEC)
        out.MergeFrom(spec)
        return out

    raw = messages(pb.JobSpec, HINTS)
    few = messages(pb.JobSpec, HINTS, max_fields=2)
    return st.one_of(raw, raw.map(merged), *[few.map(merged)] * 3).map(safe_spec)


def safe_spec(spec: Any) -> Any:
    """No fuzzed script does anything if it ever ran (the fixture makes sure none runs)."""
    if spec.script:
        spec.script = SAFE_SCRIPT + spec.script
    return spec


# ---- the cluster and its stubs -------------------------------------------------------------------


class Fuzzer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        address = load_settings(home=cluster.home).coordinator_address
        options = [
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ]
        self.channel = grpc.insecure_channel(address, options=options)
        self.queue = queue_pb2_grpc.QueueStub(self.channel)
        self.agent = agent_pb2_grpc.AgentLinkStub(self.channel)
        self.metadata = cluster.client().call_metadata()
        self.keys = {
            node: create_key_file(cluster.home / "nodes" / f"{node}.key") for node in FUZZ_NODES
        }
        self.turn = 0
        for node in FUZZ_NODES:  # known to the coordinator, with GPUs (for Drain and Resume)
            register = apb.Register(
                node=node,
                gpus=[pb.GpuUnit(uuid=u, index=i, memory=80 << 30) for i, u in enumerate(UUIDS)],
                cpus=8,
                mem=64 << 30,
                fake=True,
            )
            list(
                self.agent.Connect(
                    iter([apb.AgentMessage(register=register)]),
                    metadata=self.node_metadata(node),
                    timeout=CALL_TIMEOUT,
                )
            )

    def node_metadata(self, node: str) -> tuple[tuple[str, str], ...]:
        return (node_metadata(node, self.keys[node]),)

    def next_node(self) -> str:
        self.turn += 1
        return FUZZ_NODES[self.turn % len(FUZZ_NODES)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("fuzz"))
    try:
        running.start_coordinator()
        yield running
    finally:
        try:
            print_summary()
        finally:
            running.close()


@pytest.fixture(scope="module")
def fuzzer(cluster: Cluster) -> Iterator[Fuzzer]:
    made = Fuzzer(cluster)
    try:
        yield made
    finally:
        made.channel.close()


def print_summary() -> None:
    print("\n---- RPC fuzz: statuses seen per RPC ----")
    for rpc in sorted(SEEN):
        counts = ", ".join(f"{code} {n}" for code, n in SEEN[rpc].most_common())
        print(f"{rpc:24} {sum(SEEN[rpc].values()):6}  {counts}")
    print(f"unclean outcomes: {sum(n for n, _ in BAD.values())}, {len(BAD)} kinds")
    for (rpc, problem, details), (count, request) in BAD.items():
        print(f"  {rpc}: {problem} x{count}: {details!r}\n    smallest request: {request}")


# ---- checking outcomes ---------------------------------------------------------------------------


def short(request: Any, limit: int = 600) -> str:
    text = repr(request) if not hasattr(request, "ListFields") else str(request)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def check(rpc: str, code: grpc.StatusCode, details: str, request: Any) -> None:
    SEEN[rpc][code.name] += 1
    clean = code in CLEAN or (code is C.DEADLINE_EXCEEDED and rpc in STREAMING)
    if code is C.UNAVAILABLE and details.startswith("storage unavailable"):
        clean = True
    problem = "" if clean else f"status {code.name}"
    if "\n" in details:
        problem = (problem + " and " if problem else "") + "details of several lines"
    if problem:
        bad(rpc, problem, details, short(request))
        if not KEEP_GOING:
            raise AssertionError(f"{rpc} answered {problem}: {details[:500]!r}")


def bad(rpc: str, problem: str, details: str, request: str) -> None:
    seen = BAD.setdefault((rpc, problem, details[:200]), [0, request])
    seen[0] += 1
    if len(request) < len(seen[1]):
        seen[1] = request


def fits(size: int) -> None:
    """Requests stay under the server's message limit: fuzzed ones are skipped, written ones
    must."""
    if currently_in_test_context():
        assume(size < MAX_REQUEST)
    else:
        assert size < MAX_REQUEST, size


def call(rpc: str, run: Callable[[], Any], request: Any) -> tuple[grpc.StatusCode, Any]:
    answer, code, details = None, C.OK, ""
    try:
        answer = run()
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
    check(rpc, code, details, request)  # outside the except: one origin for hypothesis
    return code, answer


def unary(fz: Fuzzer, rpc: str, request: Any, metadata: Any = None) -> grpc.StatusCode:
    fits(request.ByteSize())
    method = getattr(fz.queue, rpc)
    metadata = fz.metadata if metadata is None else metadata
    code, _ = call(rpc, lambda: method(request, metadata=metadata, timeout=CALL_TIMEOUT), request)
    return code


def submit(fz: Fuzzer, requests: list[queue_pb2.SubmitRequest]) -> grpc.StatusCode:
    fits(sum(r.ByteSize() for r in requests))
    code, results = call(
        "Submit",
        lambda: list(fz.queue.Submit(iter(requests), metadata=fz.metadata, timeout=CALL_TIMEOUT)),
        requests,
    )
    if code is C.OK:
        assert len(results) == len(requests), (requests, results)
        for request, result in zip(requests, results, strict=True):
            check("Submit/result", C(_code_tuple(result.code)), result.message, request)
            assert bool(result.job_ids) == (result.code == 0), result
    return code


def _code_tuple(number: int) -> tuple[int, str]:
    for code in C:
        if code.value[0] == number:
            return code.value  # type: ignore[no-any-return]
    raise AssertionError(f"a submission answered code {number}, no gRPC status code")


def watch(fz: Fuzzer, request: queue_pb2.WatchRequest, metadata: Any = None) -> None:
    fits(request.ByteSize())
    metadata = fz.metadata if metadata is None else metadata

    def run() -> None:
        stream = fz.queue.Watch(request, metadata=metadata, timeout=STREAM_TIMEOUT)
        for n, _ in enumerate(stream):
            if n >= 2:
                stream.cancel()  # three messages are enough
                return

    call("Watch", run, request)


def connect(
    fz: Fuzzer, stream: list[apb.AgentMessage], metadata: Any, pause: float = 0.0
) -> grpc.StatusCode:
    fits(sum(m.ByteSize() for m in stream))

    def messages_out() -> Iterator[apb.AgentMessage]:
        for message in stream:
            yield message
            if pause:
                time.sleep(pause)

    def run() -> list[apb.CoordinatorMessage]:
        return list(fz.agent.Connect(messages_out(), metadata=metadata, timeout=STREAM_TIMEOUT))

    code, _ = call("Connect", run, stream)
    return code


# ---- fuzzed requests, per RPC --------------------------------------------------------------------


submit_requests = st.builds(
    queue_pb2.SubmitRequest,
    spec=spec_strategy(),
    request_key=st.one_of(st.just(""), strings(), st.sampled_from(["k" * 64, "k" * 65])),
)


@FUZZ
@given(requests=st.lists(submit_requests, max_size=4))
def test_submit(fuzzer: Fuzzer, requests: list[queue_pb2.SubmitRequest]) -> None:
    submit(fuzzer, requests)


@FUZZ
@given(request=messages(queue_pb2.GetJobRequest, HINTS))
def test_get_job(fuzzer: Fuzzer, request: queue_pb2.GetJobRequest) -> None:
    unary(fuzzer, "GetJob", request)


@FUZZ
@given(request=messages(queue_pb2.ListJobsRequest, HINTS, max_repeated=8))
def test_list_jobs(fuzzer: Fuzzer, request: queue_pb2.ListJobsRequest) -> None:
    unary(fuzzer, "ListJobs", request)


@pytest.mark.parametrize("rpc", ["Cancel", "Hold", "Release"])
@FUZZ
@given(request=messages(queue_pb2.JobSelection, HINTS, max_repeated=8))
def test_job_actions(fuzzer: Fuzzer, rpc: str, request: queue_pb2.JobSelection) -> None:
    unary(fuzzer, rpc, request)


@FUZZ
@given(request=messages(queue_pb2.WatchRequest, HINTS, max_repeated=8))
def test_watch(fuzzer: Fuzzer, request: queue_pb2.WatchRequest) -> None:
    watch(fuzzer, request)


@FUZZ
@given(request=messages(queue_pb2.ListNodesRequest, HINTS))
def test_list_nodes(fuzzer: Fuzzer, request: queue_pb2.ListNodesRequest) -> None:
    unary(fuzzer, "ListNodes", request)


@FUZZ
@given(
    request=st.builds(
        queue_pb2.AddCronRequest,
        schedule=st.one_of(*[st.sampled_from(HINTS["schedule"])] * 3, strings()),
        spec=spec_strategy(),
    )
)
def test_add_cron(fuzzer: Fuzzer, request: queue_pb2.AddCronRequest) -> None:
    unary(fuzzer, "AddCron", request)


@FUZZ
@given(request=messages(queue_pb2.ListCronRequest, HINTS))
def test_list_cron(fuzzer: Fuzzer, request: queue_pb2.ListCronRequest) -> None:
    unary(fuzzer, "ListCron", request)


@FUZZ
@given(request=messages(queue_pb2.RemoveCronRequest, HINTS))
def test_remove_cron(fuzzer: Fuzzer, request: queue_pb2.RemoveCronRequest) -> None:
    unary(fuzzer, "RemoveCron", request)


def drain_requests() -> st.SearchStrategy[queue_pb2.DrainRequest]:
    """Drains of the fuzzer's own nodes (or nodes that do not exist), never of a real one."""
    node = st.one_of(st.sampled_from(HINTS["node"]), strings()).filter(
        lambda name: name not in ("a", "b")
    )
    fuzzed = messages(queue_pb2.DrainRequest, HINTS)
    return st.builds(
        lambda request, name: queue_pb2.DrainRequest(
            node=name, gpu=request.gpu, reason=request.reason
        ),
        fuzzed,
        node,
    )


@pytest.mark.parametrize("rpc", ["Drain", "Resume"])
@FUZZ
@given(request=drain_requests())
def test_drain_resume(fuzzer: Fuzzer, rpc: str, request: queue_pb2.DrainRequest) -> None:
    unary(fuzzer, rpc, request)


@pytest.mark.parametrize("rpc", ["IssueToken", "RevokeTokens"])
@FUZZ
@given(request=messages(queue_pb2.TokenRequest, HINTS))
def test_tokens(fuzzer: Fuzzer, rpc: str, request: queue_pb2.TokenRequest) -> None:
    unary(fuzzer, rpc, request)


# ---- AgentLink.Connect ---------------------------------------------------------------------------

later_messages = messages(apb.AgentMessage, HINTS, max_repeated=4)


@FUZZ
@given(
    register=messages(apb.Register, HINTS, max_repeated=4),
    own_name=st.booleans(),
    later=st.lists(later_messages, max_size=4),
    data=st.data(),
)
def test_connect(
    fuzzer: Fuzzer,
    register: apb.Register,
    own_name: bool,
    later: list[apb.AgentMessage],
    data: st.DataObject,
) -> None:
    node = fuzzer.next_node()
    if own_name or not register.node:
        register.node = node
    first = apb.AgentMessage(register=register)
    if data.draw(st.booleans(), "first message carries more"):
        first.MergeFrom(data.draw(later_messages, "more"))
    connect(fuzzer, [first, *later], fuzzer.node_metadata(node))


@FUZZ
@given(
    stream=st.lists(
        st.one_of(later_messages, messages(apb.AgentMessage, HINTS, max_repeated=2)),
        max_size=4,
    )
)
def test_connect_without_a_registration_first(
    fuzzer: Fuzzer, stream: list[apb.AgentMessage]
) -> None:
    node = fuzzer.next_node()
    connect(fuzzer, stream, fuzzer.node_metadata(node))


@FUZZ
@given(
    ids=st.lists(st.integers(0, 60), max_size=6),
    reports=st.lists(messages(apb.JobReport, HINTS), min_size=1, max_size=6),
    heartbeat=messages(apb.Heartbeat, HINTS),
)
def test_connect_reports_on_real_jobs(
    fuzzer: Fuzzer,
    ids: list[int],
    reports: list[apb.JobReport],
    heartbeat: apb.Heartbeat,
) -> None:
    """Reports naming jobs that exist (small ids), after a plausible registration."""
    node = fuzzer.next_node()
    for report, job_id in zip(reports, ids, strict=False):
        report.job_id = job_id
    register = apb.Register(
        node=node,
        gpus=[pb.GpuUnit(uuid=UUIDS[0], index=0, name="A100", memory=80 * 2**30)],
        cpus=8,
        mem=64 * 2**30,
        fake=True,
        version="0",
        jobs=reports[:2],
    )
    stream = [
        apb.AgentMessage(register=register),
        apb.AgentMessage(heartbeat=heartbeat),
        apb.AgentMessage(reports=reports),
    ]
    connect(fuzzer, stream, fuzzer.node_metadata(node), pause=0.05)


# ---- authorization metadata ----------------------------------------------------------------------

PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
authorizations = st.one_of(
    st.text(PRINTABLE, max_size=80),
    st.builds(lambda s: "Bearer " + s, st.text(PRINTABLE, max_size=80)),
    st.builds(lambda s: "Token " + s, st.text(PRINTABLE, max_size=80)),
    st.builds(lambda s: "Node " + s, st.text(PRINTABLE, max_size=80)),
    st.builds(
        lambda n, k: f"Node {n} {k}",
        st.sampled_from([*FUZZ_NODES, "a", "nosuch", "../fz1", ".", "-x"]),
        st.text(PRINTABLE, max_size=130),
    ),
    st.builds(  # non-ASCII as it would have to travel: escaped
        lambda s: "Bearer " + s.encode("unicode_escape").decode("ascii"), st.text(max_size=40)
    ),
    st.builds(lambda s: "Bearer " + s.encode().hex(), st.text(max_size=40)),
    st.sampled_from(
        [
            "",
            " ",
            "Bearer",
            "Bearer ",
            "bearer x",
            "Bearer  gpuq1.0.9999999999.00.0000",
            "Bearer gpuq1.0.9999999999.00.0000",
            "Bearer gpuq1.-1.9999999999.00.00",
            "Bearer gpuq1.00000000000000000000000000.99999999999999999999.x.y",
            "Bearer gpuq1....",
            "Bearer gpuq1.0.0.0.0.0",
            "Token gpuqt_",
            "Token gpuqt_" + "A" * 43,
            "Node",
            "Node fz1",
            "Node fz1 ",
            "Node fz1 " + "A" * 43,
            "Node fz1 " + "A" * 129,
            "Bearer " + "x" * 505,
            "Bearer " + "x" * 506,
            "Bearer " + "x" * 5000,
            "Bearer " + "x" * 60_000,
            "Token " + "y" * 100_000,
        ]
    ),
)
QUEUE_CALLS: list[tuple[str, Any]] = [
    ("GetJob", queue_pb2.GetJobRequest(job_id=1)),
    ("ListJobs", queue_pb2.ListJobsRequest()),
    ("Cancel", queue_pb2.JobSelection(job_ids=["1"])),
    ("Hold", queue_pb2.JobSelection(job_ids=["1"])),
    ("Release", queue_pb2.JobSelection(job_ids=["1"])),
    ("ListNodes", queue_pb2.ListNodesRequest()),
    ("AddCron", queue_pb2.AddCronRequest(schedule="0 0 1 1 *", spec=GOOD_SPEC)),
    ("ListCron", queue_pb2.ListCronRequest()),
    ("RemoveCron", queue_pb2.RemoveCronRequest(id=1)),
    ("Drain", queue_pb2.DrainRequest(node="fz1", reason="x")),
    ("Resume", queue_pb2.DrainRequest(node="fz1")),
    ("IssueToken", queue_pb2.TokenRequest(user="root")),
    ("RevokeTokens", queue_pb2.TokenRequest(user="root")),
]


@FUZZ
@given(
    authorization=authorizations,
    which=st.integers(0, len(QUEUE_CALLS) + 2),
    twice=st.booleans(),
    extra=st.lists(
        st.tuples(
            st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1),
            st.text(PRINTABLE, max_size=50),
        ).filter(lambda kv: not kv[0].startswith("grpc") and not kv[0].endswith("-bin")),
        max_size=3,
    ),
)
def test_bad_authorization_is_refused(
    fuzzer: Fuzzer,
    authorization: str,
    which: int,
    twice: bool,
    extra: list[tuple[str, str]],
) -> None:
    """Hostile `authorization` values (alone, or twice: the last one counts either way) are
    refused UNAUTHENTICATED or PERMISSION_DENIED on every RPC, and never answered INTERNAL."""
    metadata: tuple[tuple[str, str], ...] = (*extra, ("authorization", authorization))
    if twice:  # a good credential, then a bad one
        metadata = (*fuzzer.metadata, *metadata)
    rpc = "auth:" + (QUEUE_CALLS[which][0] if which < len(QUEUE_CALLS) else "Submit/Watch/Connect")
    kind = which - len(QUEUE_CALLS)
    try:
        if kind < 0:
            method = getattr(fuzzer.queue, QUEUE_CALLS[which][0])
            method(QUEUE_CALLS[which][1], metadata=metadata, timeout=CALL_TIMEOUT)
        elif kind == 0:
            list(
                fuzzer.queue.Submit(
                    iter([queue_pb2.SubmitRequest(spec=GOOD_SPEC)]),
                    metadata=metadata,
                    timeout=CALL_TIMEOUT,
                )
            )
        elif kind == 1:
            list(fuzzer.queue.Watch(queue_pb2.WatchRequest(), metadata=metadata, timeout=1))
        else:
            register = apb.AgentMessage(register=apb.Register(node="fz1"))
            list(fuzzer.agent.Connect(iter([register]), metadata=metadata, timeout=2))
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
    else:
        code, details = C.OK, ""
    SEEN[rpc][code.name] += 1
    refused = {C.UNAUTHENTICATED, C.PERMISSION_DENIED}
    if sum(len(k) + len(v) for k, v in metadata) > 8192:
        refused.add(C.RESOURCE_EXHAUSTED)  # gRPC's own limit on metadata, before gpuq sees it
    if code not in refused or "\n" in details:
        bad(rpc, f"status {code.name}", details, f"authorization {short(metadata)}")
        if not KEEP_GOING:
            raise AssertionError((rpc, code, details, metadata))


def test_a_user_credential_cannot_connect_as_a_node(fuzzer: Fuzzer) -> None:
    register = apb.AgentMessage(register=apb.Register(node="fz1"))
    code = connect(fuzzer, [register], fuzzer.metadata)
    assert code in (C.UNAUTHENTICATED, C.PERMISSION_DENIED)


def test_a_node_key_cannot_call_the_queue(fuzzer: Fuzzer) -> None:
    code = unary(fuzzer, "ListJobs", queue_pb2.ListJobsRequest(), fuzzer.node_metadata("fz1"))
    assert code in (C.UNAUTHENTICATED, C.PERMISSION_DENIED)


# ---- hand-written edge cases per RPC -------------------------------------------------------------

BIG = "x" * 100_000
EDGE_UNARY: list[tuple[str, Any]] = [
    ("GetJob", queue_pb2.GetJobRequest()),
    ("GetJob", queue_pb2.GetJobRequest(job_id=2**64 - 1)),
    ("GetJob", queue_pb2.GetJobRequest(job_id=2**63)),
    ("GetJob", queue_pb2.GetJobRequest(job_id=1, task=0)),
    ("GetJob", queue_pb2.GetJobRequest(job_id=1, task=2**32 - 1)),
    ("ListJobs", queue_pb2.ListJobsRequest(limit=2**32 - 1)),
    ("ListJobs", queue_pb2.ListJobsRequest(job_ids=list(range(1, 10_001)))),
    ("ListJobs", queue_pb2.ListJobsRequest(job_ids=list(range(1, 10_002)))),
    ("ListJobs", queue_pb2.ListJobsRequest(job_ids=[0, 2**64 - 1])),
    ("ListJobs", queue_pb2.ListJobsRequest(states=["pending"] * 10_001)),
    ("ListJobs", queue_pb2.ListJobsRequest(user=BIG, finished=True)),
    ("ListJobs", queue_pb2.ListJobsRequest(array_job_id=0, expand_arrays=True)),
    ("ListJobs", queue_pb2.ListJobsRequest(finished=True, limit=1, with_pending_info=True)),
    ("ListJobs", queue_pb2.ListJobsRequest(with_pending_info=True, expand_arrays=True)),
    *[
        (rpc, selection)
        for rpc in ("Cancel", "Hold", "Release")
        for selection in (
            queue_pb2.JobSelection(),
            queue_pb2.JobSelection(job_ids=["1"] * 10_001),
            queue_pb2.JobSelection(job_ids=[str(i) for i in range(1, 10_001)]),
            queue_pb2.JobSelection(job_ids=["1"], reason="x" * 1001),
            queue_pb2.JobSelection(job_ids=["1"], reason="a\nb\x1b]0;x\x07"),
            queue_pb2.JobSelection(job_ids=["18446744073709551616", "1_4294967296"]),
            queue_pb2.JobSelection(job_ids=["18446744073709551615_4294967295"]),
            queue_pb2.JobSelection(job_ids=["", "\x00", "1\x00", "\u0661"]),
            queue_pb2.JobSelection(job_ids=[BIG]),
            queue_pb2.JobSelection(job_ids=["9" * 5000]),
        )
    ],
    ("ListNodes", queue_pb2.ListNodesRequest()),
    ("AddCron", queue_pb2.AddCronRequest(schedule=BIG, spec=GOOD_SPEC)),
    ("AddCron", queue_pb2.AddCronRequest(schedule="0 0 1 1 *", spec=GOOD_SPEC)),
    ("AddCron", queue_pb2.AddCronRequest(schedule="0 0 31 2 *", spec=GOOD_SPEC)),
    ("AddCron", queue_pb2.AddCronRequest(schedule="* * * * *", spec=pb.JobSpec())),
    ("AddCron", queue_pb2.AddCronRequest(schedule="*/1000000000000 * * * *", spec=GOOD_SPEC)),
    ("AddCron", queue_pb2.AddCronRequest(schedule="0 0 1 1 * \x00", spec=GOOD_SPEC)),
    ("ListCron", queue_pb2.ListCronRequest()),
    ("RemoveCron", queue_pb2.RemoveCronRequest()),
    ("RemoveCron", queue_pb2.RemoveCronRequest(id=2**64 - 1)),
    ("RemoveCron", queue_pb2.RemoveCronRequest(id=2**63)),
    *[
        (rpc, drain)
        for rpc in ("Drain", "Resume")
        for drain in (
            queue_pb2.DrainRequest(),
            queue_pb2.DrainRequest(node="fz1"),
            queue_pb2.DrainRequest(node="fz1", reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu="0", reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu="99", reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu="-1", reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu="4294967296", reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu="9" * 400, reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu=UUIDS[0], reason="r"),
            queue_pb2.DrainRequest(node="fz1", gpu="MIG-nope", reason="r"),
            queue_pb2.DrainRequest(node="fz1", reason=BIG),
            queue_pb2.DrainRequest(node="fz1", reason="a\nb"),
            queue_pb2.DrainRequest(node=BIG, reason="r"),
            queue_pb2.DrainRequest(node="../fz1", reason="r"),
            queue_pb2.DrainRequest(node="fz1\x00", reason="r"),
        )
    ],
    *[
        (rpc, queue_pb2.TokenRequest(user=user))
        for rpc in ("IssueToken", "RevokeTokens")
        for user in ("", "root", "nosuchuser", "a\nb", "x" * 1000, BIG, "\x00", "../root", "ü")
    ],
]


@pytest.mark.parametrize(("rpc", "request_"), EDGE_UNARY, ids=lambda v: str(v)[:30])
def test_edge_cases(fuzzer: Fuzzer, rpc: str, request_: Any) -> None:
    unary(fuzzer, rpc, request_)


def _spec(**fields: Any) -> pb.JobSpec:
    spec = pb.JobSpec()
    spec.CopyFrom(GOOD_SPEC)
    spec.MergeFrom(pb.JobSpec(**fields))
    return spec


EDGE_SUBMITS: list[list[queue_pb2.SubmitRequest]] = [
    [],
    [queue_pb2.SubmitRequest()],
    [queue_pb2.SubmitRequest(spec=_spec(hold=True), request_key="k" * 64)],
    [queue_pb2.SubmitRequest(spec=_spec(hold=True), request_key="k" * 65)],
    [queue_pb2.SubmitRequest(spec=_spec(hold=True), request_key="k\x00")],
    [queue_pb2.SubmitRequest(spec=_spec(hold=True), request_key="\u00e9")],
    [queue_pb2.SubmitRequest(spec=_spec(hold=True), request_key="same")] * 3,
    [queue_pb2.SubmitRequest(spec=_spec(hold=True))] * 50,
    [queue_pb2.SubmitRequest(spec=_spec(script=SAFE_SCRIPT + "x" * 1_000_000))],
    [queue_pb2.SubmitRequest(spec=_spec(script=SAFE_SCRIPT + "x" * 3_900_000))],
    [queue_pb2.SubmitRequest(spec=_spec(args=["x"] * 100_000))],
    [queue_pb2.SubmitRequest(spec=_spec(env={f"K{i}": "v" for i in range(10_000)}))],
    [queue_pb2.SubmitRequest(spec=_spec(env={"": "v", "A=B": "v", "\x00": "v"}))],
    [queue_pb2.SubmitRequest(spec=_spec(array=pb.ArraySpec(indices=[2**32 - 1])))],
    [queue_pb2.SubmitRequest(spec=_spec(array=pb.ArraySpec(max_running=0, indices=[0])))],
    [queue_pb2.SubmitRequest(spec=_spec(array=pb.ArraySpec()))],
    [queue_pb2.SubmitRequest(spec=_spec(dependencies=[pb.Dependency(job_id=1)] * 10_001))],
    [queue_pb2.SubmitRequest(spec=_spec(dependencies=[pb.Dependency(job_id=1, task=2**32 - 1)]))],
    [queue_pb2.SubmitRequest(spec=_spec(resources=pb.Resources(mig="x" * 1000)))],
    [queue_pb2.SubmitRequest(spec=_spec(resources=pb.Resources(gpus=1, mig="1g.10gb")))],
    [queue_pb2.SubmitRequest(spec=_spec(resources=pb.Resources(time_limit=2**64 - 1)))],
    [queue_pb2.SubmitRequest(spec=_spec(resources=pb.Resources(gpu_mem=2**64 - 1)))],
    [queue_pb2.SubmitRequest(spec=_spec(resources=pb.Resources(cpus=2**32 - 1)))],
    [queue_pb2.SubmitRequest(spec=_spec(begin_time=float("inf")))],
    [queue_pb2.SubmitRequest(spec=_spec(begin_time=-1e308))],
    [queue_pb2.SubmitRequest(spec=_spec(nice=2**31 - 1))],
    [queue_pb2.SubmitRequest(spec=_spec(umask=2**32 - 1))],
    [queue_pb2.SubmitRequest(spec=_spec(output=BIG, error=BIG))],
    [queue_pb2.SubmitRequest(spec=_spec(workdir="/" + "x" * 5000))],
    [queue_pb2.SubmitRequest(spec=_spec(qos=BIG))],
    [queue_pb2.SubmitRequest(spec=_spec(source=BIG))],
]


@pytest.mark.parametrize("requests", EDGE_SUBMITS, ids=range(len(EDGE_SUBMITS)))
def test_submit_edge_cases(fuzzer: Fuzzer, requests: list[queue_pb2.SubmitRequest]) -> None:
    submit(fuzzer, requests)


EDGE_WATCHES = [
    queue_pb2.WatchRequest(),
    queue_pb2.WatchRequest(job_ids=[0]),
    queue_pb2.WatchRequest(job_ids=[2**64 - 1]),
    queue_pb2.WatchRequest(job_ids=[2**63]),
    queue_pb2.WatchRequest(job_ids=[1] * 10_001),
    queue_pb2.WatchRequest(job_ids=list(range(1, 10_001))),
]


@pytest.mark.parametrize("request_", EDGE_WATCHES, ids=range(len(EDGE_WATCHES)))
def test_watch_edge_cases(fuzzer: Fuzzer, request_: queue_pb2.WatchRequest) -> None:
    watch(fuzzer, request_)


def _register(node: str = "fz1", **fields: Any) -> apb.AgentMessage:
    return apb.AgentMessage(register=apb.Register(node=node, **fields))


EDGE_CONNECTS: list[tuple[str, list[apb.AgentMessage]]] = [
    ("fz1", []),
    ("fz1", [apb.AgentMessage()]),
    ("fz1", [apb.AgentMessage(heartbeat=apb.Heartbeat(at=1.0))]),
    ("fz1", [_register(node="")]),
    ("fz1", [_register(node="fz2")]),
    ("fz1", [_register(node="a")]),
    ("fz1", [_register(), _register()]),
    ("fz1", [_register(gpus=[pb.GpuUnit(uuid=UUIDS[0])] * 2)]),
    ("fz1", [_register(gpus=[pb.GpuUnit(uuid=f"GPU-{i}", index=i) for i in range(10_000)])]),
    ("fz1", [_register(gpus=[pb.GpuUnit(uuid="", index=2**32 - 1, memory=2**64 - 1)])]),
    ("fz1", [_register(gpus=[pb.GpuUnit(uuid=BIG)])]),
    ("fz1", [_register(topology=[pb.TopologyLink(a="x", b="y", distance=2**32 - 1)] * 1000)]),
    ("fz1", [_register(cpus=2**32 - 1, mem=2**64 - 1, version=BIG, driver=BIG)]),
    ("fz1", [_register(isolation="a\nb\x1b]0;x\x07", gpu_problem="\x00" * 1000)]),
    (
        "fz1",
        [
            _register(
                jobs=[
                    apb.JobReport(job_id=j, kind=cast(Any, k), attempt=2**32 - 1)
                    for j in (0, 1, 2**63, 2**64 - 1)
                    for k in (0, 1, 2, 3, 99, -1)
                ]
            )
        ],
    ),
    (
        "fz1",
        [
            _register(),
            apb.AgentMessage(
                heartbeat=apb.Heartbeat(
                    at=float("nan"),
                    usage=[
                        pb.GpuUsage(
                            uuid=UUIDS[0],
                            memory_used=2**64 - 1,
                            utilization=2**32 - 1,
                            job_ids=[2**64 - 1],
                            health="bogus",
                            health_reason=BIG,
                            notes=["x"] * 1000,
                        )
                    ]
                    * 5,
                    not_accepting=True,
                    not_accepting_reason=BIG,
                )
            ),
        ],
    ),
    (
        "fz1",
        [
            _register(),
            apb.AgentMessage(
                reports=[
                    apb.JobReport(
                        job_id=j,
                        kind=apb.JobReport.ENDED,
                        end_state=state,
                        result=pb.JobResult(
                            exit_code=-(2**31), signal=2**31 - 1, reason="x" * 5000
                        ),
                        at=at,
                        peak_mem=2**64 - 1,
                        peak_gpu_mem=2**64 - 1,
                        attempt=a,
                    )
                    for j in (1, 2, 2**64 - 1)
                    for state in ("completed", "bogus", "")
                    for at in (float("inf"), -1.0)
                    for a in (0, 1, 2**32 - 1)
                ]
            ),
        ],
    ),
    (
        "fz1",
        [
            _register(),
            apb.AgentMessage(
                reports=[apb.JobReport(job_id=1, kind=apb.JobReport.RUNNING)] * 10_000
            ),
        ],
    ),
]


@pytest.mark.parametrize(("node", "stream"), EDGE_CONNECTS, ids=range(len(EDGE_CONNECTS)))
def test_connect_edge_cases(fuzzer: Fuzzer, node: str, stream: list[apb.AgentMessage]) -> None:
    connect(fuzzer, stream, fuzzer.node_metadata(node), pause=0.05)


# ---- afterwards ----------------------------------------------------------------------------------


def test_the_coordinator_still_works(cluster: Cluster, fuzzer: Fuzzer) -> None:
    """Runs last: the coordinator survived, and once the fuzzed jobs and cron entries are gone
    a real agent runs a real job."""
    assert cluster.coordinator is not None and cluster.coordinator.poll() is None
    for entry in fuzzer.queue.ListCron(
        queue_pb2.ListCronRequest(), metadata=fuzzer.metadata, timeout=CALL_TIMEOUT
    ).entries:
        fuzzer.queue.RemoveCron(
            queue_pb2.RemoveCronRequest(id=entry.id), metadata=fuzzer.metadata, timeout=30
        )

    def nothing_live() -> bool:
        live = fuzzer.queue.ListJobs(
            queue_pb2.ListJobsRequest(expand_arrays=True),
            metadata=fuzzer.metadata,
            timeout=CALL_TIMEOUT,
        ).jobs
        ids = sorted({str(j.array_job_id if j.HasField("array_job_id") else j.id) for j in live})
        for start in range(0, len(ids), 5000):
            fuzzer.queue.Cancel(
                queue_pb2.JobSelection(job_ids=ids[start : start + 5000], reason="fuzz over"),
                metadata=fuzzer.metadata,
                timeout=CALL_TIMEOUT,
            )
        return not live

    wait_for(nothing_live, timeout=30, what="every fuzzed job to be cancelled")
    assert (
        fuzzer.queue.ListCron(
            queue_pb2.ListCronRequest(), metadata=fuzzer.metadata, timeout=CALL_TIMEOUT
        ).entries
        == []
    )
    cluster.start_agent("a", "2xA100-80GB")
    job = cluster.submit("true")
    assert cluster.wait_state(job, "completed").state is JobState.COMPLETED
    assert cluster.coordinator.poll() is None
    log = (cluster.root / "coordinator.log").read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log[-5000:]
    assert not BAD, list(BAD)
