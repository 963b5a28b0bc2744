"""A CLI helper that cannot fork its spares (a user at their process limit, a machine out of
memory) never leaves callers waiting on a socket nobody accepts on: with no spare at all it
leaves (the stub then runs each call itself); with one, it serves with that one."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from gpuq.cli.fast import helper_process
from gpuq.cli.fast.code_check import CodeCheck
from gpuq.cli.fast.helper_process import SPARES, Helper


def idle_spare(listener: Any, control: socket.socket, *rest: Any) -> NoReturn:
    """A spare that only waits to be killed (no gRPC in a test's child)."""
    control.recv(1)
    os._exit(0)


@pytest.fixture
def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Helper]:
    monkeypatch.setattr(helper_process, "spare", idle_spare)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = str(folder / "cli-test.sock")
    lock = os.open(str(folder / "cli-test.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    made = Helper(path, lock, CodeCheck.taken(), 60.0)
    yield made
    made.retire()
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def failing_forks(monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    """os.fork works `after` times, then fails as at RLIMIT_NPROC."""
    real = os.fork
    left = [after]

    def fork() -> int:
        if left[0] <= 0:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        left[0] -= 1
        return real()

    monkeypatch.setattr(os, "fork", fork)  # the helper's own os module


def test_no_spare_at_all_and_the_helper_leaves(
    helper: Helper, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_forks(monkeypatch, after=0)
    helper.listen()
    assert helper.listener is None and helper.spares == {}
    assert not os.path.exists(helper.path)  # a caller finds no helper: it runs the call itself


def test_one_spare_and_the_helper_serves_with_it(
    helper: Helper, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert SPARES == 2
    failing_forks(monkeypatch, after=1)
    helper.listen()
    assert helper.listener is not None and len(helper.spares) == 1
    with socket.socket(socket.AF_UNIX) as caller:
        caller.connect(helper.path)  # the socket is there, and listened on
