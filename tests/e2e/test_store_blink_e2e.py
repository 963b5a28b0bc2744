"""The store may blink: PostgreSQL restarted while jobs run and end. The coordinator waits out
the outage (writes lost to it are tried again until they land), and every job completes
without a coordinator restart; none stays running after its processes exited.

Runs on a private PostgreSQL cluster of its own (initdb into a temporary folder, a free port),
since restarting the shared server would break other tests. Needs root (PostgreSQL runs as the
`postgres` user, through runuser) and the server binaries; skipped otherwise.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from helpers import skip_or_fail
from private_postgres import PrivatePostgres, pg_bin

from gpuq.domain.states import JobState
from gpuq.errors import StorageUnavailable

JOBS = 24
GPUS = 4


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bin_dir = pg_bin()
    if bin_dir is None:
        skip_or_fail("the PostgreSQL server binaries (/usr/lib/postgresql/*/bin) are missing")
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        skip_or_fail("needs root and runuser, to run PostgreSQL as the postgres user")
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        skip_or_fail("no postgres user")
    root = Path(tempfile.mkdtemp(prefix="gpuq-pg-"))
    os.chown(root, owner.pw_uid, owner.pw_gid)
    root.chmod(0o755)
    server = PrivatePostgres(bin_dir, root)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


def test_jobs_complete_through_postgres_restarts(
    tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    cluster = Cluster(tmp_path, f'database_url = "{private_postgres.url}"\n')
    try:
        cluster.start_coordinator()
        coordinator = cluster.coordinator
        assert coordinator is not None
        cluster.start_agent("a", f"{GPUS}xA100-80GB")
        ended = tmp_path / "ended"  # each job leaves a file here as its last act
        ended.mkdir()
        ids = [cluster.submit(f"sleep 0.3; mktemp -p {ended}", gpus=1) for _ in range(JOBS)]

        def done() -> int:
            finished = cluster.client().list(finished=True, job_ids=ids)
            return sum(j.state is JobState.COMPLETED for j in finished)

        # restart while jobs run and end: once early in the stream, once later. The server
        # stays down until jobs have ended meanwhile, so their ends' writes meet the outage.
        for stage in (GPUS, JOBS // 2):
            wait_for(lambda s=stage: done() >= s, 30, f"{stage} jobs to complete")  # type: ignore[misc]
            # (the jobs start in waves: between one wave's ends and the next's starts, none runs)
            wait_for(lambda: cluster.client().list(states=["running"]), 10, "jobs running")
            before = len(list(ended.iterdir()))
            private_postgres.stop_fast()
            if stage == GPUS:  # a user's call meanwhile: the coordinator says its store is down
                with pytest.raises(StorageUnavailable, match="retry later"):
                    cluster.client().cancel(424242)  # (an id of nothing: nothing can change)
            wait_for(lambda b=before: len(list(ended.iterdir())) >= b + 2, 10, "jobs to end")  # type: ignore[misc]
            time.sleep(0.2)  # (an outage has a length) the agent reports the ends meanwhile
            private_postgres.start_again()

        # a job that needs every GPU: nothing may still hold one
        last = wait_for(lambda: cluster.submit("true", gpus=GPUS), 20, "a submission")
        ids.append(last)
        wait_for(lambda: done() == len(ids), 40, "every job to complete")
        # memory agrees with the store: nothing live is left, nothing stays running
        wait_for(lambda: not cluster.client().list(), 10, "no live jobs")
        assert coordinator.poll() is None, "the coordinator must not have exited"
        assert cluster.coordinator is coordinator
        log = (tmp_path / "coordinator.log").read_text()
        assert "handling agent reports failed" not in log
        # each outage met writes that waited it out, and is logged once, not once per try
        assert log.count("the job store failed (") == 2
        assert log.count("the job store is back after") == 2
    finally:
        cluster.close()


def test_restart_with_idle_coordinator_then_work(
    tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    """The pool's connections died with the server: the next calls reconnect."""
    cluster = Cluster(tmp_path, f'database_url = "{private_postgres.url}"\n')
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "2xA100-80GB")
        first = cluster.submit("true", gpus=1)
        cluster.wait_state(first, "completed")
        private_postgres.restart()
        started = time.monotonic()
        second = wait_for(lambda: cluster.submit("true", gpus=2), 20, "a submission")
        assert cluster.wait_state(second, "completed", "failed").state is JobState.COMPLETED
        assert time.monotonic() - started < 20
    finally:
        cluster.close()
