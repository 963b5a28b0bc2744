"""Pure parts of the dashboard's server (gpuq.web.log_tail, gpuq.web.dashboard_api): reading a
job's output file as root would, and the listing parameters. The routes themselves run in
tests/e2e/test_web_e2e.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuq.errors import InvalidInput, NotFound, PermissionDenied
from gpuq.web.dashboard_api import job_request, listing_request
from gpuq.web.log_tail import LOG_TAIL, read_tail


def test_tail_of_a_long_file(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"a" * 10 + b"\xff" + b"b" * LOG_TAIL)
    tail = read_tail(str(path), os.geteuid())
    assert tail["truncated"] and tail["size"] == LOG_TAIL + 11
    assert tail["text"] == "b" * LOG_TAIL
    path.write_bytes(b"ok \xff\n")
    tail = read_tail(str(path), os.geteuid())
    assert tail == {"path": str(path), "text": "ok \ufffd\n", "size": 5, "truncated": False}


def test_tail_refuses_what_is_not_the_users_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("secret\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(PermissionDenied, match="not readable from the coordinator"):
        read_tail(str(link), os.geteuid())
    with pytest.raises(PermissionDenied):
        read_tail(str(target), os.geteuid() + 1)  # another user's file
    with pytest.raises(PermissionDenied):
        read_tail(str(tmp_path), os.geteuid())  # a folder
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        with pytest.raises(PermissionDenied):
            read_tail(str(fifo), os.geteuid())
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "a FIFO must be refused at once, never waited on"
    with pytest.raises(NotFound):
        read_tail(str(tmp_path / "missing"), os.geteuid())
    with pytest.raises(NotFound):
        read_tail("relative/path", os.geteuid())


def test_listing_parameters() -> None:
    assert listing_request({}).with_pending_info and not listing_request({}).finished
    finished = listing_request({"finished": "1"})
    assert finished.finished and finished.limit == 50
    assert listing_request({"finished": "1", "limit": "100000"}).limit == 500
    assert listing_request({"user": "alice"}).user == "alice"
    for bad in ({"finished": "yes"}, {"limit": "-1"}, {"user": "x" * 65}):
        with pytest.raises(InvalidInput):
            listing_request(bad)
    assert (job_request("12").job_id, job_request("12").HasField("task")) == (12, False)
    assert (job_request("12_3").job_id, job_request("12_3").task) == (12, 3)
    with pytest.raises(NotFound):
        job_request("0")
