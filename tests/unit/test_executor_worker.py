"""gpuq.executor_worker on files alone: what a job of gpuq.Executor runs."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from helpers import needs

from gpuq.executor_worker import (
    ERROR,
    OK,
    UnsafeFile,
    read_trusted,
    task_paths,
    write_atomically,
)


def write_job(folder: Path, fn: Any, calls: list[Any], task: int | None = None) -> Path:
    """The files the Executor writes for one job (or one array task)."""
    fn_path = folder / "3.fn"
    write_atomically(fn_path, pickle.dumps({"sys_path": [], "fn": cloudpickle.dumps(fn)}))
    args_path, _ = task_paths(fn_path, task)
    write_atomically(args_path, cloudpickle.dumps(calls))
    return fn_path


def run_worker(fn_path: Path, task: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUQ_ARRAY_TASK_ID"}
    if task is not None:
        env["GPUQ_ARRAY_TASK_ID"] = str(task)
    command = [sys.executable, "-m", "gpuq.executor_worker", str(fn_path)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_a_call_writes_its_value_and_exits_0(tmp_path: Path) -> None:
    base = 5
    fn_path = write_job(tmp_path, lambda x, y=0: x * base + y, [((2,), {"y": 1}), ((3,), {})])
    done = run_worker(fn_path)
    assert done.returncode == 0, done.stderr
    result = tmp_path / "3.result"
    assert pickle.loads(read_trusted(result)) == (OK, [11, 15])
    assert stat.S_IMODE(result.stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_an_array_task_reads_its_own_arguments(tmp_path: Path) -> None:
    fn_path = write_job(tmp_path, str.upper, [(("b",), {})], task=1)
    assert run_worker(fn_path, task=1).returncode == 0
    assert pickle.loads(read_trusted(tmp_path / "3.1.result")) == (OK, ["B"])


def test_an_exception_is_written_with_its_traceback_and_exits_1(tmp_path: Path) -> None:
    def divide(x: int) -> float:
        return 1 / x

    fn_path = write_job(tmp_path, divide, [((1,), {}), ((0,), {})])
    done = run_worker(fn_path)
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr  # into the job's output file
    kind, index, pickled, text, type_name, message = pickle.loads(
        read_trusted(tmp_path / "3.result")
    )
    assert (kind, index, type_name, message) == (
        ERROR,
        1,
        "builtins.ZeroDivisionError",
        "division by zero",
    )
    assert isinstance(pickle.loads(pickled), ZeroDivisionError)
    assert "in divide" in text and text.rstrip().endswith("division by zero")


def test_payloads_others_may_write_are_never_unpickled(tmp_path: Path) -> None:
    payload = tmp_path / "0.fn"
    payload.write_bytes(b"not read")
    payload.chmod(0o620)
    with pytest.raises(UnsafeFile, match="writable by others"):
        read_trusted(payload)
    payload.chmod(0o600)
    link = tmp_path / "1.fn"
    link.symlink_to(payload)
    with pytest.raises(OSError):  # O_NOFOLLOW: ELOOP
        read_trusted(link)
    with pytest.raises(UnsafeFile, match="not a regular file"):
        read_trusted(tmp_path)


@needs(os.getuid() == 0, "giving a file away needs root")
def test_a_payload_of_another_user_is_refused(tmp_path: Path) -> None:
    payload = tmp_path / "0.fn"
    payload.write_bytes(b"not read")
    os.chown(payload, 65534, 65534)
    with pytest.raises(UnsafeFile, match="belongs to uid 65534"):
        read_trusted(payload)
    fn_path = tmp_path / "3.fn"
    fn_path.write_bytes(b"x")
    os.chown(fn_path, 65534, 65534)
    done = run_worker(fn_path)
    assert done.returncode == 1 and "belongs to uid 65534" in done.stderr
