"""Fixtures shared by every test folder: job stores on each backend, specs, a fake clock."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import in_ci, skip_or_fail
from sqlalchemy import create_engine, text

from gpuq.store.api import Store

PG_URL_VAR = "GPUQ_TEST_PG_URL"


def pg_url() -> str | None:
    """The PostgreSQL server for tests; in CI its absence is an error, not a skip."""
    url = os.environ.get(PG_URL_VAR)
    if not url and in_ci():
        pytest.fail(f"CI=true but {PG_URL_VAR} is not set: the PostgreSQL suite must run in CI")
    return url


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A URL whose connections use a fresh schema of their own, dropped afterwards."""
    base = pg_url()
    if not base:
        skip_or_fail(f"{PG_URL_VAR} not set")
    schema = f"gpuq_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(ok, reason): skip unless ok; fail instead under CI=true (helpers.needs)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """helpers.needs marks, decided before any fixture is set up: a skip mark where one is not
    met (pytest's skipping plugin, which runs next, reports it at the test), under CI=true a
    failure (skip_or_fail)."""
    for mark in item.iter_markers("needs"):
        ok, reason = mark.args
        if not ok:
            if in_ci():
                skip_or_fail(reason)
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gpuq.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store test runs once per backend."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_schema_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = Store.open(store_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session", autouse=True)
def cli_helper_runtime() -> Iterator[Path]:
    """The `gpuq` calls of this session start their CLI helpers (gpuq.cli.fast) in a runtime
    folder of its own (XDG_RUNTIME_DIR, 0700), idle-limited, all stopped at the end: no helper
    outlives the tests, and none of the session serves anything else."""
    import shutil
    import tempfile

    from gpuq.cli.fast.helper_control import stop_helpers

    folder = Path(tempfile.mkdtemp(prefix="gpuq-run-"))
    folder.chmod(0o700)
    saved = {name: os.environ.get(name) for name in ("XDG_RUNTIME_DIR", "GPUQ_CLI_HELPER_IDLE")}
    os.environ.update(XDG_RUNTIME_DIR=str(folder), GPUQ_CLI_HELPER_IDLE="120")
    try:
        yield folder
    finally:
        if (folder / "gpuq").exists():
            stop_helpers(folder / "gpuq")
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many backend-parametrised tests ran on each store (CI must show both)."""
    counts = {"sqlite": 0, "postgresql": 0}
    skipped = {"sqlite": 0, "postgresql": 0}
    for outcome, tally in (("passed", counts), ("skipped", skipped)):
        for report in terminalreporter.stats.get(outcome, []):
            for backend in tally:
                if f"[{backend}]" in getattr(report, "nodeid", ""):
                    tally[backend] += 1
    terminalreporter.write_line(
        f"store backends: SQLite {counts['sqlite']} passed ({skipped['sqlite']} skipped), "
        f"PostgreSQL {counts['postgresql']} passed ({skipped['postgresql']} skipped)"
    )
