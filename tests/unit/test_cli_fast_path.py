"""The CLI's fast path (gpuq/cli/fast/) stays fenced: the `gpuq` stub loads nothing beyond
the interpreter's own modules before it talks to the helper, the request and the answers go
through the protocol's encoder and decoder unchanged, and no module of the fast path knows a
verb (gpuq.cli.verbs is the one table; tests/e2e/test_cli_helper_e2e.py runs a new verb
through a helper)."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpuq.cli.fast import protocol
from gpuq.cli.fast.serve_again import SERVE_CALLS, SERVE_FOR, may_return
from gpuq.cli.verbs import OWN_PROCESS, PROCESS_REUSABLE, VERBS

FAST = Path(protocol.__file__).parent


def test_the_stub_loads_only_its_own_modules() -> None:
    """What scripts/gpuq imports before main(): gpuq's own small modules, no library (each
    costs start-up time on every call; bench/cli_bench.py times it)."""
    code = (
        "import sys; before = set(sys.modules)\n"
        "from gpuq.cli.fast.stub import main\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    # __future__ (a few lines of the standard library, which `from __future__ import
    # annotations` loads) is there already where an editable install's finder loaded it
    assert set(result.stdout.split()) - {"__future__"} == {
        "gpuq",
        "gpuq.cli",
        "gpuq.cli.fast",
        "gpuq.cli.fast.protocol",
        "gpuq.cli.fast.stub",
        "gpuq.cli.verbs",
    }


def test_no_module_of_the_fast_path_imports_a_verb() -> None:
    allowed = {"gpuq", "gpuq.cli.verbs", "gpuq.cli.group", "gpuq.client", "gpuq.config.loading"}
    verb_modules = set(VERBS.values())
    for path in FAST.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name == "gpuq" or name.startswith("gpuq."):
                    assert name not in verb_modules, (path.name, name)
                    assert name in allowed or name.startswith("gpuq.cli.fast."), (path.name, name)


def test_every_verb_has_its_module_and_the_own_process_verbs_are_verbs() -> None:
    assert OWN_PROCESS.issubset(VERBS)
    assert PROCESS_REUSABLE.issubset(VERBS) and not PROCESS_REUSABLE & OWN_PROCESS
    root = FAST.parents[2]
    for module in set(VERBS.values()):
        assert (root / (module.replace(".", "/") + ".py")).is_file(), module


def test_a_request_reads_back_as_sent(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        ignored = protocol.send_request(ours, ["queue", "--json", "é"])
        request = protocol.read_request(theirs)
    finally:
        os.chdir(here)
        ours.close()
        theirs.close()
    try:
        assert request.argv[1:] == ["queue", "--json", "é"]
        assert request.ignored == ignored
        assert request.groups == os.getgroups()
        mask = os.umask(0o022)
        os.umask(mask)
        assert request.umask == mask
        assert dict(request.environ) == dict(os.environb)
        assert len(request.encodings) == 3
        assert os.path.samefile(f"/proc/self/fd/{request.fds[3]}", tmp_path)
    finally:
        for fd in request.fds:
            os.close(fd)


def test_answers_are_a_letter_and_a_big_endian_int() -> None:
    assert protocol.answer(protocol.EXIT, 3 << 8) == b"X\x00\x00\x03\x00"
    assert protocol.answer(protocol.STALE) == b"S\x00\x00\x00\x00"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        theirs.sendall(protocol.answer(protocol.PID, 4242))
        assert protocol.read_answer(ours) == (protocol.PID, 4242)


def test_a_child_serves_again_a_bounded_number_of_calls_for_a_bounded_time() -> None:
    """So a credential or token it read is read again by a fresh child, and what a call
    leaves in memory cannot pile up."""
    now = time.monotonic()
    assert may_return(0, now) and may_return(SERVE_CALLS - 2, now - SERVE_FOR + 5)
    assert not may_return(SERVE_CALLS - 1, now)  # the next call is its last
    assert not may_return(0, now - SERVE_FOR)
