"""The `gpuq` command line against a running cluster: output, exit codes, errors."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import ALLOW_ROOT, MARKER, Cluster, wait_for

from gpuq.config.loading import load_settings


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One coordinator and node a (4 GPUs) for the module's refused submissions (each test
    checks that nothing was made): a cluster started once, not once per case."""
    running = Cluster(tmp_path_factory.mktemp("refusals"))
    try:
        running.start_coordinator()
        running.start_agent("a", "4xA100-80GB")
        yield running
    finally:
        running.close()


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_submit_reads_directives_and_flags_win(cluster: Cluster) -> None:
    script = cluster.root / "train.sh"
    script.write_text(
        "#!/bin/bash\n"
        "# a comment\n"
        "#GPUQ --gpus 2 --name from-directive\n"
        "#GPUQ --time 5 --env FROM_DIRECTIVE=yes\n"
        'echo "gpus=$GPUQ_GPUS name=$GPUQ_JOB_NAME arg=$1 env=$FROM_DIRECTIVE"\n'
        "#GPUQ --gpus 4\n"  # after the first command: not a directive
    )
    result = cluster.gpuq("submit", "--name", "from-flag", str(script), "hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Submitted job ")
    job_id = int(result.stdout.split()[-1])
    job = cluster.wait_state(job_id, "completed")
    assert job.spec.resources.gpus == 2 and job.spec.resources.time_limit == 300
    assert (cluster.root / f"gpuq-{job_id}.out").read_text() == (
        "gpus=2 name=from-flag arg=hello env=yes\n"
    )


def test_submit_wait_returns_the_exit_code(cluster: Cluster) -> None:
    result = cluster.gpuq("submit", "--wait", "--wrap", "exit 3")
    assert result.returncode == 3, result.stderr
    ok = cluster.gpuq("submit", "-W", "--gpus", "1", "--wrap", "true")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpuz", "2", "--wrap", "true"], "No such option"),
        (["--mem", "40X", "--wrap", "true"], "invalid --mem '40X'"),
        (["--time", "1:99", "--wrap", "true"], "invalid --time '1:99'"),
        (["--gpus", "2x", "--wrap", "true"], "invalid --gpus '2x'"),
        (["-G", "h100", "--wrap", "true"], "--gpus h100:1 can never run"),  # a type alone: one
        (["missing.sh"], "invalid script 'missing.sh': no such file"),
        (["."], "is a folder"),
        (["--gpus", "5", "--wrap", "true"], "--gpus 5 can never run: the largest node (a) has 4"),
        (["--qos", "platinum", "--wrap", "true"], "no such qos; known: high, low, normal"),
        (["--array", "5-1", "--wrap", "true"], "invalid --array"),
        (["--after", "x", "--wrap", "true"], "invalid --after"),
        ([], "give a script to run"),
    ],
)
def test_bad_submissions_are_refused_with_one_line(
    refusing: Cluster, args: list[str], message: str
) -> None:
    cluster = refusing
    before = len(cluster.client().list()) + len(cluster.client().list(finished=True))
    line = one_line_error(cluster.gpuq("submit", *args))
    assert message in line
    after = len(cluster.client().list()) + len(cluster.client().list(finished=True))
    assert after == before, "a refused submission must not create a job"


def test_script_without_shebang_is_refused(refusing: Cluster) -> None:
    cluster = refusing
    script = cluster.root / "plain.sh"
    script.write_text("echo hi\n")
    assert "#!" in one_line_error(cluster.gpuq("submit", str(script)))


def test_listings_have_json(cluster: Cluster) -> None:
    done = cluster.submit("echo hi", gpus=1)
    cluster.wait_state(done, "completed")
    gate = cluster.root / "gate"
    running = cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", gpus=4)
    cluster.wait_state(running, "running")
    blocked = cluster.submit("true", gpus=4)
    wait_for(
        lambda: cluster.client().list_raw(job_ids=[blocked])[0].pending.reasons,
        what="a pending reason",
    )
    queue = json.loads(cluster.gpuq("queue", "--json").stdout)
    by_id = {j["id"]: j for j in queue}
    assert by_id[running]["state"] == "running" and by_id[running]["node"] == "a"
    assert by_id[blocked]["pending_reasons"] == [
        "needs 4 GPUs on one node; largest free block is 2 (node b)"
    ]
    assert "largest free block is 2 (node b)" in cluster.gpuq("queue").stdout
    history = json.loads(cluster.gpuq("history", "--json").stdout)
    assert [(j["id"], j["state"], j["exit_code"]) for j in history] == [(done, "completed", 0)]
    nodes = json.loads(cluster.gpuq("nodes", "--json").stdout)
    assert [(n["name"], len(n["gpus"]), n["fake"]) for n in nodes] == [
        ("a", 4, True),
        ("b", 2, True),
    ]
    assert all(g["allocated"] for g in nodes[0]["gpus"])
    status = json.loads(cluster.gpuq("status", "--json").stdout)
    assert {j["id"] for j in status["jobs"]} == {running, blocked}
    shown = json.loads(cluster.gpuq("show", str(done), "--json").stdout)
    assert [e["to"] for e in shown["events"]] == ["pending", "running", "completed"]
    submitted, started, ended = (e["cause"] for e in shown["events"])  # what caused each
    # an idle queue: it started in the transaction that created it, one cause for both
    assert submitted.startswith("Submit by ") and started == submitted
    assert ended == f"report from node {shown['node']}"  # its agent said it ended
    assert f"[{ended}]" in cluster.gpuq("show", str(done)).stdout
    text = cluster.gpuq("status").stdout
    assert f"job {running}" in text and "4/4 GPUs in use" in text
    gate.touch()


def test_the_readmes_first_example_runs_on_fake_gpus(cluster: Cluster) -> None:
    """The Quick start's `gpuq submit` line, as written, on a machine without a GPU: the job
    prints its GPU; once it ended, `gpuq status` still shows it, with its end state."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("## User guide", 1)[0]
    line = next(x for x in quick_start.splitlines() if x.startswith("gpuq submit "))
    result = cluster.gpuq(*shlex.split(line)[1:])
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout.split()[-1])
    output = cluster.root / f"gpuq-{job_id}.out"
    wait_for(lambda: output.exists() and "my GPU: GPU-" in output.read_text(), what="its GPU")
    assert cluster.gpuq("cancel", str(job_id)).returncode == 0
    cluster.wait_state(job_id, "cancelled")
    failed = cluster.submit("exit 3")
    cluster.wait_state(failed, "failed")
    text = cluster.gpuq("status").stdout
    assert "2 ended in the last hour" in text, text
    ended = text.split("Ended in the last hour", 1)[1].splitlines()[1:]
    assert [line.split()[:1] + line.split()[2:3] for line in ended] == [
        [str(failed), "F"],
        [str(job_id), "CA"],
    ], text
    status = json.loads(cluster.gpuq("status", "--json").stdout)
    assert [(j["id"], j["state"]) for j in status["ended"]] == [
        (failed, "failed"),
        (job_id, "cancelled"),
    ]


def test_ctrl_c_on_submit_wait_says_the_job_runs_on(cluster: Cluster) -> None:
    waiting = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", "submit", "--wait", "--wrap", "sleep 60"],
        cwd=cluster.root,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiting.stdout is not None and waiting.stderr is not None
    job_id = int(waiting.stdout.readline().split()[-1])
    cluster.wait_state(job_id, "running")
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(20) == 130
    assert waiting.stderr.read() == (
        f"\ngpuq submit: stopped waiting; job {job_id} keeps running; "
        f"gpuq cancel {job_id} stops it\n"
    )
    assert cluster.job(job_id).state.value == "running"


def test_logs_follow_until_the_job_ends(cluster: Cluster) -> None:
    gate = cluster.root / "gate"
    job_id = cluster.submit(f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo last")
    cluster.wait_state(job_id, "running")
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", "logs", "-f", str(job_id)],
        cwd=cluster.root,
        env=cluster.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    assert follower.stdout.readline() == "first\n"
    gate.touch()
    assert follower.stdout.read() == "last\n"
    assert follower.wait(20) == 0


def test_a_refused_action_names_the_job_once(lone_coordinator: Cluster) -> None:
    cluster = lone_coordinator
    job_id = cluster.submit("true", hold=True)
    result = cluster.gpuq("hold", str(job_id))
    assert result.returncode == 2
    assert result.stderr == f"gpuq hold: job {job_id}: cannot go from held to held\n"
    result = cluster.gpuq("update", str(job_id), "--nice", "5")
    assert result.returncode == 0 and result.stdout.count(f"job {job_id}") == 1, result
    cluster.gpuq("cancel", str(job_id))
    result = cluster.gpuq("update", str(job_id), "--nice", "6")
    assert result.returncode == 2 and result.stderr.count(f"job {job_id}") == 1, result


def test_a_request_too_big_names_the_largest_node(lone_coordinator: Cluster) -> None:
    cluster = lone_coordinator
    args = ["agent", "--node-name", "a", "--fake-gpus", "2xL4-24GB", "--mem", "23.5G"]
    cluster.agents["a"] = cluster._spawn([*args, "--cpus", "4"], "agent-a")
    cluster.wait_node("a", "up")
    result = cluster.gpuq("submit", "--mem", "30G", "--wrap", "true")
    assert "--mem 30G can never run: the largest node (a) has 23.5G" in one_line_error(result)
    assert cluster.client().list_raw() == []


@pytest.mark.parametrize(
    ("program", "warned"), [("/nonexistent/sendmail", True), ("/bin/true", False)]
)
def test_mail_types_without_a_mail_program_warn_at_submit(
    tmp_path: Path, program: str, warned: bool
) -> None:
    cluster = Cluster(tmp_path, f'mail_program = "{program}"\n')
    try:
        cluster.start_coordinator()
        result = cluster.gpuq("submit", "--hold", "--mail-type", "END", "--wrap", "true")
        assert result.returncode == 0, result.stderr
        warning = "gpuq submit: warning: --mail-type: no mail will be sent: this machine has no "
        assert (warning in result.stderr) is warned, result.stderr
        if warned:
            assert f"mail_program {program} is missing" in result.stderr
        assert cluster.gpuq("submit", "--hold", "--wrap", "true").stderr == ""
    finally:
        cluster.close()


def test_cancel_unknown_job_is_bad_input(lone_coordinator: Cluster) -> None:
    cluster = lone_coordinator
    result = cluster.gpuq("cancel", "424242")
    assert result.returncode == 2
    assert "no job 424242" in result.stderr


def test_dead_server_says_how_to_start_it(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
    finally:
        cluster.close()
    for args in (["status"], ["submit", "--wrap", "true"], ["queue", "--json"]):
        result = cluster.gpuq(*args)
        assert result.returncode == 3, result  # unavailable: retry later
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "gpuq serve" in lines[0], result.stderr
    never = Cluster(tmp_path / "never")
    result = never.gpuq("status")
    assert result.returncode == 3 and "gpuq serve" in result.stderr


def test_quick_start_serve_without_gpus(tmp_path: Path) -> None:
    """README's quick start, verbatim: `gpuq serve`, then submit and status, no GPU, no flags."""
    env = {**os.environ, "GPUQ_HOME": str(tmp_path / "home")}
    env.pop("GPUQ_CONFIG", None)
    if os.geteuid() == 0:  # CI runs as root: its jobs would run as root, allowed only so
        (tmp_path / "home").mkdir(mode=0o700)
        (tmp_path / "home" / "config.toml").write_text(
            "[coordinator]\n" + ALLOW_ROOT + "[agent]\n" + ALLOW_ROOT
        )
    marker = Cluster(tmp_path / "c")  # only for the marker-based cleanup
    env[MARKER] = marker.marker
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", "serve"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "gpuq.cli.main", *args],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )

        wait_for(
            lambda: run("nodes").returncode == 0 and "up" in run("nodes").stdout,
            what="serve to have a node",
        )
        submitted = run("submit", "--gpus", "1", "--wait", "--wrap", "echo hello from gpuq")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[-1]
        assert (tmp_path / f"gpuq-{job_id}.out").read_text() == "hello from gpuq\n"
        assert "FAKE" in run("status").stdout
        assert "FAKE GPUs instead" in (tmp_path / "serve.log").read_text()
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(15) == 0
        marker.close()
    # a clean stop leaves no job folders behind (a root agent's are in /dev/shm)
    assert not load_settings(home=tmp_path / "home").agent_run_root.exists()
