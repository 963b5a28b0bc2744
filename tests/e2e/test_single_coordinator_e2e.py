"""One coordinator per GPUQ_HOME and per store (issue 8): a second `gpuq serve` or
`gpuq coordinator` is refused with the first one's pid, and leaves the first one, its socket and
its address file alone; a coordinator killed with SIGKILL does not block the next one. Start-up
trouble (a bad config, an unreachable or malformed database URL) is one line, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from e2e_cluster import Cluster, wait_for
from sqlalchemy import create_engine, text

from gpuq.store.engine import PG_LOCK_CLASS, pg_lock_key


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def identity(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_dev, info.st_ino


def answers(cluster: Cluster) -> bool:
    return cluster.gpuq("queue").returncode == 0


def start_when_free(cluster: Cluster, timeout: float = 30.0) -> None:
    """Start a coordinator, again until the old one's lock is gone (a PostgreSQL server may
    take a moment to end a dead client's session)."""
    deadline = time.monotonic() + timeout
    while True:
        address_file = cluster.home / "coordinator.json"
        address_file.unlink(missing_ok=True)
        cluster.coordinator = cluster._spawn(["coordinator"], "coordinator")
        process = cluster.coordinator
        wait_for(
            lambda: address_file.exists() or process.poll() is not None,  # noqa: B023
            what="the coordinator to listen or exit",
        )
        if process.poll() is None:
            wait_for(lambda: answers(cluster), what="the new coordinator to answer")
            return
        assert time.monotonic() < deadline, (cluster.root / "coordinator.log").read_text()
        time.sleep(0.2)


# ---- one GPUQ_HOME ---------------------------------------------------------------------------


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Cluster]:
    """`gpuq serve` (coordinator and a local agent) running in a fresh home."""
    cluster = Cluster(tmp_path)
    try:
        cluster.coordinator = cluster._spawn(["serve", "--fake-gpus", "1"], "serve")
        wait_for(lambda: answers(cluster), what="gpuq serve to answer")
        yield cluster
    finally:
        cluster.close()


def test_second_serve_on_the_same_home_is_refused(serving: Cluster) -> None:
    first = serving.coordinator
    assert first is not None
    socket = serving.home / "gpuq.sock"
    before = identity(socket)
    address = (serving.home / "coordinator.json").read_text()
    for command in (["serve", "--fake-gpus", "1"], ["coordinator"]):
        result = serving.gpuq("--home", str(serving.home), *command, timeout=60)
        line = one_line(result, 3)
        assert f"pid {first.pid}" in line and str(serving.home) in line, line
        assert f"unix:{socket}" in line, line
    # the first one is untouched: running, reachable, its socket and address file the same
    assert first.poll() is None
    assert answers(serving)
    assert identity(socket) == before
    assert (serving.home / "coordinator.json").read_text() == address
    job = serving.submit("true", gpus=1)
    assert serving.wait_state(job, "completed").node


def test_a_killed_coordinator_does_not_block_the_next(serving: Cluster) -> None:
    socket = serving.home / "gpuq.sock"
    old = identity(socket)
    serving.kill(serving.coordinator)
    assert socket.exists()  # SIGKILL leaves the socket behind
    start_when_free(serving)
    assert identity(socket) != old  # the stale socket was replaced, under the lock
    lock = json.loads((serving.home / "coordinator.lock").read_text())
    assert serving.coordinator is not None and lock["pid"] == serving.coordinator.pid


def test_a_clean_stop_removes_only_its_own_socket(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
        assert cluster.coordinator is not None
        socket = cluster.home / "gpuq.sock"
        assert socket.is_socket()
        cluster.coordinator.terminate()
        assert cluster.coordinator.wait(20) == 0
        assert not socket.exists()
    finally:
        cluster.close()


def test_two_homes_on_one_sqlite_file_exclude_each_other(tmp_path: Path) -> None:
    database = tmp_path / "shared" / "queue.db"
    setting = f'database_url = "sqlite:///{database}"\n'
    first, second = Cluster(tmp_path / "a", setting), Cluster(tmp_path / "b", setting)
    try:
        first.start_coordinator()
        assert first.coordinator is not None
        line = one_line(second.gpuq("--home", str(second.home), "coordinator", timeout=60), 3)
        assert f"pid {first.coordinator.pid}" in line and str(database) in line, line
        assert answers(first)
        first.kill(first.coordinator)
        start_when_free(second)
    finally:
        first.close()
        second.close()


# ---- one PostgreSQL database ----------------------------------------------------------------


@pytest.mark.postgres
def test_two_coordinators_on_one_postgres_database(tmp_path: Path, pg_schema_url: str) -> None:
    """The lock is per database and schema: a fresh schema keeps other tests out of the way."""
    first, second = Cluster(tmp_path / "a"), Cluster(tmp_path / "b")
    for cluster in (first, second):
        cluster.env["GPUQ_DATABASE_URL"] = pg_schema_url
    try:
        first.start_coordinator()
        assert first.coordinator is not None
        tcp = first.tcp_address
        result = second.gpuq("--home", str(second.home), "coordinator", timeout=60)
        line = one_line(result, 3)
        assert f"pid={first.coordinator.pid}" in line and tcp in line, line
        assert "schema gpuq_test_" in line, line
        assert not (second.home / "coordinator.json").exists()
        assert answers(first)
        first.kill(first.coordinator)  # PostgreSQL ends its session, and the lock with it
        start_when_free(second)
        job = second.gpuq("submit", "--hold", "--wrap", "true")
        assert job.returncode == 0, job.stderr
    finally:
        first.close()
        second.close()


@pytest.mark.postgres
def test_a_coordinator_keeps_or_gives_up_its_postgres_lock(
    tmp_path: Path, pg_schema_url: str
) -> None:
    """The lock lives as long as its session: a lost session is replaced, and a coordinator
    that finds the lock taken by someone else meanwhile stops (exit 3) rather than share."""
    cluster = Cluster(tmp_path)
    cluster.env["GPUQ_DATABASE_URL"] = pg_schema_url
    schema = unquote(pg_schema_url).rsplit("search_path=", 1)[1]
    key = {"c": PG_LOCK_CLASS, "k": pg_lock_key(schema)}
    admin = create_engine(
        pg_schema_url.replace("postgresql://", "postgresql+psycopg://", 1),
        isolation_level="AUTOCOMMIT",
    )
    try:
        cluster.start_coordinator()
        coordinator = cluster.coordinator
        assert coordinator is not None
        with admin.connect() as conn:

            def holder() -> int | None:
                """The backend that holds the lock for our coordinator, if one does."""
                pid: int | None = conn.execute(
                    text(
                        "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                        " WHERE l.locktype = 'advisory' AND l.granted"
                        " AND l.classid::bigint = :c AND l.objid::bigint = :k"
                        " AND l.objsubid = 2 AND a.application_name LIKE :name"
                    ),
                    {**key, "name": f"gpuq pid={coordinator.pid} %"},
                ).scalar()
                return pid

            def end_session(pid: int | None) -> None:
                if pid is not None:
                    conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})

            first = wait_for(holder, what="the coordinator's lock session")
            end_session(first)
            second = wait_for(
                lambda: (pid := holder()) is not None and pid != first and pid,
                what="the coordinator to take its lock again",
            )
            assert answers(cluster)
            # someone else takes the lock while the coordinator's session is gone
            with admin.connect() as thief:
                deadline = time.monotonic() + 30
                taken = False
                while not taken:
                    assert time.monotonic() < deadline, "never got between the two"
                    end_session(second)
                    taken = bool(
                        thief.execute(text("SELECT pg_try_advisory_lock(:c, :k)"), key).scalar()
                    )
                    second = holder()
                assert coordinator.wait(30) == 3
        log = (cluster.root / "coordinator.log").read_text()
        assert "lost the store lock to another session" in log, log
        assert "Traceback" not in log, log
    finally:
        admin.dispose()
        cluster.close()


# ---- start-up trouble is one line ------------------------------------------------------------


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text('[coordinator]\nheartbeat_interval = "five"\n')
    try:
        for command in (["coordinator"], ["serve"], ["agent"], ["queue"]):
            line = one_line(cluster.gpuq("--config", str(bad), *command), 2)
            assert "[coordinator] heartbeat_interval" in line and '"five"' in line, line
        assert not (cluster.home / "gpuq.sock").exists()
    finally:
        cluster.close()


def test_unreachable_database_is_one_line_and_exit_3(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.env["GPUQ_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/x"
    try:
        line = one_line(cluster.gpuq("coordinator", timeout=60), 3)
        assert "127.0.0.1:1" in line and "cannot connect" in line, line
        assert not (cluster.home / "gpuq.sock").exists()
        # the lock went with the process: a coordinator on the home's SQLite starts at once
        del cluster.env["GPUQ_DATABASE_URL"]
        cluster.start_coordinator()
    finally:
        cluster.close()


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("postgresql://postgres@127.0.0.1:port/x", 2, "not a database URL"),
        ("postgresql://u:hunter2@127.0.0.1:99999/x", 2, "port"),
        ("mysql://db/x", 2, "expected sqlite:///PATH"),
    ],
)
def test_malformed_database_url_is_one_line_and_exit_2(
    tmp_path: Path, url: str, code: int, words: str
) -> None:
    cluster = Cluster(tmp_path)
    cluster.env["GPUQ_DATABASE_URL"] = url
    try:
        line = one_line(cluster.gpuq("coordinator", timeout=60), code)
        assert words in line and "hunter2" not in line, line
    finally:
        cluster.close()


def test_postgres_without_its_driver_says_what_to_install(tmp_path: Path) -> None:
    """As where the `postgres` extra is not installed: psycopg cannot be imported."""
    cluster = Cluster(tmp_path)
    cluster.env["GPUQ_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/x"
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.argv[0] = 'gpuq'; "
        "from gpuq.cli.fast.stub import main; main()"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, "--home", str(cluster.home), "coordinator"],
            cwd=cluster.root,
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        line = one_line(result, 2)
        assert "pip install 'lab-gpu-queue[postgres]'" in line, line
    finally:
        cluster.close()
