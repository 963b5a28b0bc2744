"""What a program, not the CLI, can send over gRPC: every field at and past its limits gets
one clear status (never INTERNAL) and changes nothing, and the queue goes on."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from e2e_cluster import Cluster

from gpuq.config.loading import load_settings
from gpuq.domain.states import JobState
from gpuq.errors import ERROR_KIND_KEY
from gpuq.v1 import queue_pb2, queue_pb2_grpc
from gpuq.v1 import types_pb2 as pb

GOOD = {"name": "x", "script": "#!/bin/sh\ntrue\n", "workdir": "/tmp"}
BAD_SPECS = [
    pb.JobSpec(),
    pb.JobSpec(**GOOD, array=pb.ArraySpec(indices=list(range(1_000_000)))),
    pb.JobSpec(**GOOD, array=pb.ArraySpec(indices=[5, 5])),
    pb.JobSpec(**GOOD, resources=pb.Resources(gpus=2**32 - 1)),
    pb.JobSpec(**GOOD, resources=pb.Resources(mem=2**64 - 1)),
    pb.JobSpec(**GOOD, begin_time=float("nan")),
    pb.JobSpec(**GOOD, begin_time=1e15),
    pb.JobSpec(**GOOD, signal=pb.WarningSignal(signal=-1, seconds=5)),
    pb.JobSpec(**GOOD, signal=pb.WarningSignal(signal=10, seconds=2**32 - 1)),
    pb.JobSpec(**GOOD, dependencies=[pb.Dependency(job_id=0)]),
    pb.JobSpec(**GOOD, dependencies=[pb.Dependency(job_id=2**64 - 1)]),
    pb.JobSpec(**GOOD, dependencies=[pb.Dependency(job_id=1, kind="maybe")]),
    pb.JobSpec(**GOOD, umask=0o7777),
    pb.JobSpec(**GOOD, nice=-(2**31)),
    pb.JobSpec(name="x", script="#!/bin/sh\ntrue\n", workdir="relative"),
    pb.JobSpec(**{**GOOD, "name": "a\nb"}),
]


def test_malformed_requests_get_one_clear_status(cluster: Cluster) -> None:
    settings = load_settings(home=cluster.home)
    channel = grpc.insecure_channel(
        settings.coordinator_address, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    stub = queue_pb2_grpc.QueueStub(channel)
    metadata = cluster.client().call_metadata()

    kinds: list[str] = []  # the error kind each refusal said, in its trailing metadata

    def status(method: str, request: Any) -> grpc.StatusCode:
        try:
            getattr(stub, method)(request, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            said = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
            kinds.append(said.get(ERROR_KIND_KEY, ""))
            return error.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    try:
        for spec in BAD_SPECS:
            [result] = stub.Submit(
                iter([queue_pb2.SubmitRequest(spec=spec)]), metadata=metadata, timeout=30
            )
            assert result.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], (spec, result)
            assert result.error_kind == "invalid_input", result
            assert not result.job_ids and "\n" not in result.message
        assert status("GetJob", queue_pb2.GetJobRequest(job_id=2**64 - 1)) == (
            grpc.StatusCode.NOT_FOUND
        )
        assert status("GetJob", queue_pb2.GetJobRequest(job_id=1, task=2**32 - 1)) == (
            grpc.StatusCode.NOT_FOUND
        )
        for request in (
            queue_pb2.ListJobsRequest(array_job_id=2**64 - 1),
            queue_pb2.ListJobsRequest(job_ids=[2**63]),
            queue_pb2.ListJobsRequest(states=["R", "bogus"]),
            queue_pb2.ListJobsRequest(job_ids=list(range(1, 10_002))),
        ):
            assert status("ListJobs", request) == grpc.StatusCode.INVALID_ARGUMENT, request
        assert status("RemoveCron", queue_pb2.RemoveCronRequest(id=2**64 - 1)) == (
            grpc.StatusCode.NOT_FOUND
        )
        assert status("AddCron", queue_pb2.AddCronRequest(schedule="* * * * *")) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        # each said which of gpuq's errors it was: a client reads that, not the words
        assert kinds[:2] == ["not_found", "not_found"] and kinds[-1] == "invalid_input", kinds
        assert kinds[2:6] == ["invalid_input"] * 4 and kinds[6] == "not_found", kinds
    finally:
        channel.close()
    assert cluster.client().list() == []  # nothing was created
    job = cluster.submit("true", gpus=1)
    assert cluster.wait_state(job, "completed").state is JobState.COMPLETED


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        "Bearer wrong",
        "Bearer gpuq1.0.9999999999.00.0000",  # a forged credential for root
        "Token gpuqt_guessed",
        "Node n1 " + "x" * 43,  # a node key on the client service
        "Bearer " + "x" * 5000,
    ],
)
def test_a_call_without_a_credential_is_refused(
    lone_coordinator: Cluster, authorization: str
) -> None:
    cluster = lone_coordinator
    settings = load_settings(home=cluster.home)
    with grpc.insecure_channel(settings.coordinator_address) as channel:
        stub = queue_pb2_grpc.QueueStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListJobs(
                queue_pb2.ListJobsRequest(),
                metadata=(("authorization", authorization),),
                timeout=10,
            )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("GetJob", "unary_unary"),
        ("Watch", "unary_stream"),
        ("Submit", "stream_stream"),
    ],
)
def test_an_undecodable_request_logs_one_line(
    lone_coordinator: Cluster, method: str, kind: str
) -> None:
    """An authenticated call whose body is not the method's message: INVALID_ARGUMENT, and
    one line in the coordinator's log, not a traceback."""
    cluster = lone_coordinator
    settings = load_settings(home=cluster.home)
    metadata = cluster.client().call_metadata()
    log_file = cluster.root / "coordinator.log"
    before = len(log_file.read_bytes())
    garbage = b"\xff\xff\xff\xff\x0f"  # a field tag past protobuf's largest
    with grpc.insecure_channel(settings.coordinator_address) as channel:
        call = getattr(channel, kind)(f"/gpuq.v1.Queue/{method}")
        with pytest.raises(grpc.RpcError) as caught:
            if kind == "unary_unary":
                call(garbage, metadata=metadata, timeout=10)
            elif kind == "unary_stream":
                list(call(garbage, metadata=metadata, timeout=10))
            else:
                list(call(iter([garbage]), metadata=metadata, timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert "could not be decoded" in (caught.value.details() or "")
    assert cluster.client().nodes() is not None  # the coordinator goes on
    text = log_file.read_bytes()[before:].decode(errors="replace")
    assert "Traceback" not in text, text
    said = [line for line in text.splitlines() if "could not be decoded" in line]
    assert len(said) == 1, text
    assert method in said[0], said
