"""Many users, one queue: who calls is the kernel's word (or an admin's token), and a user sees
and touches what is theirs.

Real throwaway Unix users (tests/e2e/unix_users.py) run the real `gpuq` command line against a
root coordinator and agent; raw gRPC streams play a rogue agent. Root only; CI runs as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import unix_users
from e2e_cluster import Cluster, wait_for
from unix_users import UnixUser, run_as

from gpuq.identity import create_key_file, node_metadata
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc, queue_pb2, queue_pb2_grpc

pytestmark = pytest.mark.timeout(120)
user_homes = unix_users.user_homes
shared_root = unix_users.shared_root
users = unix_users.two_users
unix_user = unix_users.unix_user
other_user = unix_users.unix_user  # a second user (a fixture of its own name)


def start(root: Path, config: str = "") -> Cluster:
    cluster = Cluster(root, config)
    cluster.start_coordinator()
    cluster.start_agent("n1", "2xA100-80GB")
    return cluster


def gpuq_as(user: UnixUser, home: Path, *args: str) -> tuple[int, str, str]:
    result = run_as(user, ["-m", "gpuq.cli.main", "--home", str(home), *args])
    return result.returncode, result.stdout, result.stderr


def test_users_see_all_jobs_but_only_their_own_secrets(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, bob = users
    cluster = start(shared_root)
    try:
        code, out, err = gpuq_as(
            alice,
            cluster.home,
            "submit",
            "--hold",
            "--parsable",
            "--env",
            "TOKEN=s3cret-of-alice",
            "--wrap",
            "echo s3cret-script",
        )
        assert code == 0, err
        job = out.strip()
        # alice sees her own job whole; as herself, not as root
        code, out, err = gpuq_as(alice, cluster.home, "show", job, "--json")
        assert code == 0, err
        mine = json.loads(out)
        assert "s3cret-of-alice" in out and mine["user"] == alice.name
        # bob sees the job listed, but not its script, arguments or environment
        code, out, err = gpuq_as(bob, cluster.home, "queue", "--json")
        assert code == 0 and job in out and "s3cret" not in out, (out, err)
        code, out, err = gpuq_as(bob, cluster.home, "show", job, "--json")
        assert code == 0 and "s3cret" not in out, (out, err)
        # bob may not cancel, hold or release it: one line, nothing changes
        for verb in ("cancel", "hold", "release"):
            code, out, err = gpuq_as(bob, cluster.home, verb, job)
            assert code != 0 and len(err.strip().splitlines()) == 1, (verb, out, err)
            assert f"belongs to {alice.name}" in err, err
        assert cluster.job(int(job)).state.value == "held"
        # nor drain a node, nor issue tokens: admins only
        for args in (("drain", "n1", "--reason", "mine now"), ("admin", "token", bob.name)):
            code, out, err = gpuq_as(bob, cluster.home, *args)
            assert code != 0 and "only admins" in err, (args, out, err)
        # root is an admin: sees the secret, and may cancel (logged)
        shown = cluster.gpuq("show", job, "--json")
        assert "s3cret-of-alice" in shown.stdout
        assert cluster.gpuq("cancel", job).returncode == 0
        wait_for(lambda: cluster.job(int(job)).state.value == "cancelled", what="the cancel")
        log = (cluster.root / "coordinator.log").read_text()
        assert f"admin root cancelled job {job} of {alice.name}" in log
    finally:
        cluster.close()


def test_a_users_job_runs_as_that_user(shared_root: Path, users: tuple[UnixUser, UnixUser]) -> None:
    alice, _ = users
    cluster = start(shared_root)
    try:
        code, out, err = gpuq_as(
            alice,
            cluster.home,
            "submit",
            "--parsable",
            "--wrap",
            'id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; umask',
        )
        assert code == 0, err
        job = int(out.strip())
        assert cluster.wait_state(job, "completed").state.value == "completed"
        output = alice.home / f"gpuq-{job}.out"
        lines = output.read_text().splitlines()
        assert lines[0] == str(alice.uid) and lines[1] == str(alice.gid), lines
        assert str(alice.extra_gid) in lines[2].split(), lines
        assert lines[3] == f"{alice.home} {alice.name} {alice.name}", lines
        assert output.stat().st_uid == alice.uid
    finally:
        cluster.close()


def test_root_may_not_submit_unless_the_admin_allows_it(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    config = cluster.home / "config.toml"
    config.write_text(config.read_text().replace("allow_root_jobs = true\n", ""))
    cluster.start_coordinator()
    try:
        result = cluster.gpuq("submit", "--wrap", "id")
        assert result.returncode != 0, result
        assert "root may not submit jobs" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert cluster.client().list() == []
    finally:
        cluster.close()


def test_a_member_of_the_admin_group_may_act_on_others_jobs(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, bob = users
    cluster = start(shared_root, f'admin_group = "{bob.extra_group}"\n')
    try:
        code, out, err = gpuq_as(
            alice, cluster.home, "submit", "--hold", "--parsable", "--wrap", "true"
        )
        assert code == 0, err
        job = out.strip()
        code, out, err = gpuq_as(bob, cluster.home, "cancel", job)
        assert code == 0, err
        wait_for(lambda: cluster.job(int(job)).state.value == "cancelled", what="the cancel")
    finally:
        cluster.close()


def test_users_cannot_open_the_agent_stream(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    """A user's own credential (the handshake's) on the agent service is refused before any
    registration is read."""
    alice, _ = users
    cluster = start(shared_root)
    try:
        probe = f"""
import grpc
from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.v1 import agent_pb2 as apb, agent_pb2_grpc
settings = load_settings(home=__import__("pathlib").Path({str(cluster.home)!r}))
client = Client(settings=settings)
channel = grpc.insecure_channel(settings.coordinator_address)
stream = agent_pb2_grpc.AgentLinkStub(channel).Connect(
    iter([apb.AgentMessage(register=apb.Register(node="n1"))]),
    metadata=client.call_metadata(), timeout=10)
try:
    list(stream)
    print("OK")
except grpc.RpcError as error:
    print(error.code().name)
"""
        result = run_as(alice, ["-c", probe])
        assert result.stdout.strip() == "UNAUTHENTICATED", (result.stdout, result.stderr)
        assert cluster.client().nodes()[0].state == "up"  # n1 keeps its session
    finally:
        cluster.close()


def test_an_agent_cannot_pose_as_another_node_or_end_its_jobs(tmp_path: Path) -> None:
    cluster = start(tmp_path)
    try:
        job = cluster.submit("sleep 30", gpus=1)
        cluster.wait_state(job, "running")
        address = f"unix:{cluster.home / 'gpuq.sock'}"
        rogue_key = create_key_file(cluster.home / "nodes" / "rogue.key")
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentLinkStub(channel)
            # rogue's key, n1's name: refused
            stream = stub.Connect(
                iter([apb.AgentMessage(register=apb.Register(node="n1"))]),
                metadata=(node_metadata("rogue", rogue_key),),
                timeout=10,
            )
            with pytest.raises(grpc.RpcError) as caught:
                list(stream)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # a wrong key for n1: refused
            stream = stub.Connect(
                iter([apb.AgentMessage(register=apb.Register(node="n1"))]),
                metadata=(node_metadata("n1", "x" * 43),),
                timeout=10,
            )
            with pytest.raises(grpc.RpcError) as caught:
                list(stream)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # as itself, rogue says n1's job ended: ignored
            ended = apb.JobReport(job_id=job, kind=apb.JobReport.ENDED, end_state="completed")
            messages = [
                apb.AgentMessage(register=apb.Register(node="rogue", cpus=1, mem=1 << 30)),
                apb.AgentMessage(reports=[ended]),
            ]
            done = threading.Event()

            def requests() -> Iterator[apb.AgentMessage]:
                yield from messages
                done.wait(3)

            stream = stub.Connect(
                requests(), metadata=(node_metadata("rogue", rogue_key),), timeout=5
            )
            with contextlib.suppress(grpc.RpcError):
                list(stream)
            done.set()
        assert cluster.job(job).state.value == "running"
        node = {n.name: n for n in cluster.client().nodes()}["n1"]
        assert node.state == "up" and job in node.running_jobs
        # a node that has no key on the coordinator may not register at all
        with grpc.insecure_channel(address) as channel:
            stream = agent_pb2_grpc.AgentLinkStub(channel).Connect(
                iter([apb.AgentMessage(register=apb.Register(node="stranger"))]),
                metadata=(node_metadata("stranger", "y" * 43),),
                timeout=10,
            )
            with pytest.raises(grpc.RpcError) as caught:
                list(stream)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "not configured" in (caught.value.details() or "")
    finally:
        cluster.close()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_oversized_unauthenticated_requests_cost_the_coordinator_nothing(tmp_path: Path) -> None:
    """24 concurrent 60 MiB requests without a credential: refused UNAUTHENTICATED before their
    bodies are read (the coordinator's memory stays where it was); an authenticated request
    beyond the largest valid one is refused too, not parsed."""
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    try:
        assert cluster.coordinator is not None
        pid = cluster.coordinator.pid
        before = _rss_kib(pid)
        address = f"unix:{cluster.home / 'gpuq.sock'}"
        huge = queue_pb2.ListJobsRequest(states=["x" * (60 << 20)])
        codes: list[grpc.StatusCode] = []

        def call() -> None:
            options = [("grpc.max_send_message_length", 128 << 20)]
            with grpc.insecure_channel(address, options=options) as channel:
                stub = queue_pb2_grpc.QueueStub(channel)
                try:
                    stub.ListJobs(huge, timeout=60)
                except grpc.RpcError as error:
                    codes.append(error.code())

        threads = [threading.Thread(target=call) for _ in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 24, codes
        grown = _rss_kib(pid) - before
        print(f"\ncoordinator RSS {before} KiB before, grew {grown} KiB over 24 x 60 MiB")
        assert grown < 100 * 1024, grown
        # with a credential: beyond the receive limit, refused without being parsed
        metadata = cluster.client().call_metadata()
        options = [("grpc.max_send_message_length", 128 << 20)]
        with (
            grpc.insecure_channel(address, options=options) as channel,
            pytest.raises(grpc.RpcError) as caught,
        ):
            queue_pb2_grpc.QueueStub(channel).ListJobs(huge, metadata=metadata, timeout=60)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert cluster.client().nodes() == []  # still serving
    finally:
        cluster.close()


def test_a_users_private_coordinator_serves_only_that_user(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    """A coordinator run by an ordinary user: another user (and its socket's mode aside) gets
    no credential from it."""
    alice, bob = users
    home = alice.home / "gpuq"
    serve = f"""
import os, subprocess, sys
home = {str(home)!r}
os.makedirs(home, mode=0o700, exist_ok=True)
with open(os.path.join(home, "config.toml"), "w") as f:
    f.write('[coordinator]\\nlisten = ""\\n')
print(subprocess.Popen([sys.executable, "-m", "gpuq.cli.main", "--home", home, "serve",
    "--fake-gpus", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    start_new_session=True).pid)
"""
    started = run_as(alice, ["-c", serve])
    assert started.returncode == 0, started.stderr
    try:
        wait_for(lambda: (home / "gpuq.sock.auth").exists(), timeout=30, what="alice's serve")

        def answers() -> bool:
            code, _, _ = gpuq_as(alice, home, "queue")
            return code == 0

        wait_for(answers, timeout=30, what="alice's coordinator to answer her")
        home.parent.chmod(0o711)  # even where bob can reach the socket
        home.chmod(0o711)
        code, out, err = gpuq_as(bob, home, "queue")
        assert code != 0 and f"serves only {alice.name}" in err, (out, err)
    finally:
        os.system(f"pkill -KILL -u {alice.uid} >/dev/null 2>&1")


def test_one_user_cannot_take_every_stream(tmp_path: Path) -> None:
    """Streams last: one user keeps at most MAX_STREAMS_PER_USER open; the next is refused
    RESOURCE_EXHAUSTED at once, and others are still served."""
    from gpuq.coordinator.front.grpc_queue import MAX_STREAMS_PER_USER

    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    try:
        metadata = cluster.client().call_metadata()
        address = f"unix:{cluster.home / 'gpuq.sock'}"
        # several connections: one carries at most 100 streams at once
        local = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.insecure_channel(address, options=local) for _ in range(4)]
        try:
            streams = [
                queue_pb2_grpc.QueueStub(channels[n % 4]).Watch(
                    queue_pb2.WatchRequest(), metadata=metadata, timeout=4
                )
                for n in range(MAX_STREAMS_PER_USER + 1)
            ]
            codes = [stream.code() for stream in streams]
        finally:
            for channel in channels:
                channel.close()
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 1, codes
        assert codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == MAX_STREAMS_PER_USER
        assert cluster.client().nodes() == []
    finally:
        cluster.close()


def test_the_admin_may_hide_other_users_job_names(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, bob = users
    cluster = start(shared_root, "hide_job_names = true\n")
    try:
        code, out, err = gpuq_as(
            alice,
            cluster.home,
            "submit",
            "--hold",
            "--parsable",
            "--name",
            "thesis-v2",
            "--output",
            "/tmp/%x-%j.out",
            "--wrap",
            "true",
        )
        assert code == 0, err
        code, out, err = gpuq_as(alice, cluster.home, "update", "1", "--name", "thesis-v3")
        assert code == 0, err
        code, out, err = gpuq_as(alice, cluster.home, "queue")
        assert "thesis-v3" in out, out
        code, out, err = gpuq_as(alice, cluster.home, "show", "1")
        assert "thesis-v2 -> thesis-v3" in out and "/tmp/thesis-v3-1.out" in out, out
        # the history ("name X -> Y") and %x in the output paths hide it too
        for args in (("queue",), ("queue", "--json"), ("show", "1"), ("show", "1", "--json")):
            code, shown, err = gpuq_as(bob, cluster.home, *args)
            assert code == 0 and "thesis" not in shown and "(hidden)" in shown, (args, shown)
        code, shown, err = gpuq_as(bob, cluster.home, "show", "1")
        assert "name (hidden) -> (hidden)" in shown and "/tmp/(hidden)-1.out" in shown, shown
        assert "thesis-v3" in cluster.gpuq("queue").stdout  # root is an admin
    finally:
        cluster.close()


def test_negative_nice_is_for_admins_at_submit_as_at_update(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, _ = users
    cluster = start(shared_root)
    try:
        script = shared_root / "boost.sh"
        script.write_text("#!/bin/bash\n#SBATCH --nice=-100\ntrue\n")
        script.chmod(0o755)
        for args in (
            ("--nice", "-100", "--wrap", "true"),  # a flag
            (str(script),),  # a script's header
            ("--array", "0-3", "--nice", "-1", "--wrap", "true"),  # an array
        ):
            code, out, err = gpuq_as(alice, cluster.home, "submit", "--hold", *args)
            assert code != 0 and "only admins may give a negative nice" in err, (args, out, err)
        assert cluster.client().list_raw() == []  # nothing was made
        code, out, err = gpuq_as(
            alice, cluster.home, "submit", "--hold", "--nice", "5", "--wrap", "true"
        )
        assert code == 0, err
        code, out, err = gpuq_as(alice, cluster.home, "update", "1", "--nice", "-5")
        assert code != 0 and "only admins may lower nice" in err, err
        # root is an admin: a negative nice is its to give
        assert cluster.gpuq("submit", "--hold", "--nice", "-100", "--wrap", "true").returncode == 0
    finally:
        cluster.close()
