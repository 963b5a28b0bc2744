"""The C `gpuq` (gpuq/cli/fast/stub.c) against a fake CLI helper: it sends exactly the request
the Python stub sends (argv, environment, umask, groups, ignored signals, the streams'
encodings under each locale setting), finds the helper only through the link the Python stub
made, refuses a folder that is not safely ours, runs the Python stub for everything it does
not take (no helper, stale, declined, GPUQ_CLI_HELPER=off), forwards signals, and leaves with
the child's status. tests/e2e/test_cli_c_stub_e2e.py runs it against a real helper."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from c_stub import SOURCE, FakeHelper, build_c_stub, installation_key

from gpuq.cli.fast import protocol, stub
from gpuq.cli.fast.spare import _codec_names


@pytest.fixture(scope="module")
def c_gpuq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c_stub(tmp_path_factory.mktemp("bin"))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """The process a fake PID answer names (what signals are forwarded to)."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A runtime folder (XDG_RUNTIME_DIR) and its gpuq folder, both 0700."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    (runtime / "gpuq").mkdir(mode=0o700)
    return runtime / "gpuq"


def base_env(folder: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder.parent),
        "XDG_RUNTIME_DIR": str(folder.parent),
        "GPUQ_HOME": str(folder.parent / "home"),
    }
    return {**env, **extra}


def run(
    gpuq: Path, env: dict[str, str], *args: str | bytes, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [gpuq, *args], env=env, cwd=cwd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL
    )


def links(folder: Path) -> list[Path]:
    return sorted(folder.glob("stub-*.sock"))


def test_constants_are_the_python_sides() -> None:
    source = SOURCE.read_text()

    def defined(name: str) -> str:
        found = re.search(rf'#define {name} "?([^"\n]*)"?', source)
        assert found, name
        return found.group(1)

    assert defined("MAGIC").encode() == protocol.MAGIC
    assert defined("HELPER_VAR") == stub.HELPER_VAR
    assert defined("STUB_VAR") == protocol.STUB_VAR
    assert int(defined("SIGTSTP_NUMBER")) == protocol.SIGTSTP == signal.SIGTSTP
    forwarded = re.search(r"FORWARDED\[\] = \{([^}]*)\}", source)
    assert forwarded and tuple(int(n) for n in forwarded.group(1).split(",")) == (
        protocol.FORWARDED
    )
    off = re.search(r"OFF_VALUES\[\] = \{([^}]*)\}", source)
    assert off and set(re.findall(r'"([^"]*)"', off.group(1))) == stub.OFF_VALUES


LOCALES = [
    {},
    {"LANG": "C"},
    {"LANG": "POSIX"},
    {"LANG": "C.UTF-8"},
    {"LC_ALL": "C"},
    {"LC_ALL": "C", "PYTHONUTF8": "0"},
    {"LANG": "C", "PYTHONUTF8": "0"},
    {"LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
    {"LANG": "C.UTF-8", "PYTHONUTF8": "0"},
    {"LANG": "C.UTF-8", "LC_CTYPE": "C", "PYTHONUTF8": "0"},
    {"LANG": "xx_YY.UTF-8", "PYTHONUTF8": "0"},  # no such locale: Python's C locale
    {"LANG": "C.UTF-8", "PYTHONUTF8": "1"},
    {"PYTHONIOENCODING": "latin-1:replace"},
    {"PYTHONIOENCODING": "latin-1", "LANG": "C"},
    {"PYTHONIOENCODING": ":replace", "LANG": "C.UTF-8", "PYTHONUTF8": "0"},
    {"PYTHONIOENCODING": "utf8:", "LC_ALL": "C", "PYTHONUTF8": "0"},
    {"LC_CTYPE": "C", "LC_ALL": "", "PYTHONUTF8": "", "PYTHONIOENCODING": ""},
]


def _named(settings: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items()) or "none"


@pytest.mark.parametrize("settings", LOCALES, ids=_named)
def test_the_request_is_the_python_stubs(
    c_gpuq: Path,
    folder: Path,
    sleeper: subprocess.Popen[bytes],
    tmp_path: Path,
    settings: dict[str, str],
) -> None:
    """First call: no link, so the C stub runs the Python stub, which links the helper and
    sends its request; second call: the C stub sends its own. The two must be the same (the
    encodings as the spare names them), and the Python stub's are what a fresh interpreter
    has (it is one). Under a umask, with SIGHUP ignored, a non-UTF-8 argument, another
    folder."""
    env = base_env(folder, **settings)
    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", [3, 5], sleeper.pid)
    work = tmp_path / "work"
    work.mkdir()
    args = ("queue", "--json", b"caf\xe9", "\u00e9t\u00e9")

    def call() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [c_gpuq, *args],
            env=env,
            cwd=work,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: (os.umask(0o027), signal.signal(signal.SIGHUP, signal.SIG_IGN)),
        )

    try:
        first = call()
        assert first.returncode == 3, first.stderr
        assert links(folder), "the Python stub made no link"
        second = call()
        assert second.returncode == 5, second.stderr
    finally:
        fake.close()
    python, c = (call_.request for call_ in fake.calls)
    assert [call_.exe for call_ in fake.calls] == [os.path.realpath(sys.executable), str(c_gpuq)]
    assert _codec_names(c)
    assert (c.umask, c.ignored, c.groups, c.argv, c.encodings) == (
        python.umask,
        python.ignored,
        python.groups,
        python.argv,
        python.encodings,
    )
    assert c.environ == python.environ  # in order: LC_CTYPE as Python coerced it, too
    assert c.umask == 0o027 and c.ignored == 1 << signal.SIGHUP
    assert c.argv[0] == str(c_gpuq)  # what Python's sys.argv[0] is for a script run so
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; print([f'{s.encoding}:{s.errors}' for s in "
            "(sys.stdin, sys.stdout, sys.stderr)])",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert fresh.stdout.strip() == repr(c.encodings)


def test_stale_and_declined_run_the_python_stub(
    c_gpuq: Path, folder: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    env = base_env(folder, GPUQ_CLI_HELPER="debug")
    script = [0, protocol.STALE, 7, protocol.DECLINED, 9]
    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", script, sleeper.pid)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0  # the Python stub links
        stale = run(c_gpuq, env, "queue")
        declined = run(c_gpuq, env, "queue")
    finally:
        fake.close()
    python, c = os.path.realpath(sys.executable), str(c_gpuq)
    assert [call.exe for call in fake.calls] == [python, c, python, c, python]
    assert (stale.returncode, declined.returncode) == (7, 9)
    assert stale.stderr == f"gpuq: cli helper: child {sleeper.pid}\n".encode()


def test_no_helper_the_python_stub_runs_it_and_links(c_gpuq: Path, folder: Path) -> None:
    env = base_env(folder, GPUQ_CLI_HELPER="debug", GPUQ_CLI_HELPER_IDLE="1")
    first = run(c_gpuq, env, "--version")
    assert first.returncode == 0 and first.stdout.startswith(b"gpuq, version")
    assert first.stderr.startswith(b"gpuq: cli helper: none answered"), first.stderr
    (link,) = links(folder)
    assert re.fullmatch(r"cli-[0-9a-f]{16}\.sock", os.readlink(link))
    # a helper started (GPUQ_CLI_HELPER_IDLE: it leaves a second after)
    from gpuq.cli.fast.helper_control import stop_helpers

    stop_helpers(folder)


def test_off_never_connects(c_gpuq: Path, folder: Path, sleeper: subprocess.Popen[bytes]) -> None:
    env = base_env(folder)
    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", [0], sleeper.pid)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0  # links
        for value in ("off", "OFF", "0", "no", "false"):
            result = run(c_gpuq, {**env, "GPUQ_CLI_HELPER": value}, "--version")
            assert result.returncode == 0 and result.stdout.startswith(b"gpuq, version")
    finally:
        fake.close()
    assert len(fake.calls) == 1


@pytest.mark.parametrize("mode", [0o750, 0o701, 0o1700])
def test_a_folder_not_0700_is_refused(
    c_gpuq: Path, folder: Path, sleeper: subprocess.Popen[bytes], mode: int
) -> None:
    env = base_env(folder)
    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", [0], sleeper.pid)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0  # links
        folder.chmod(mode)
        result = run(c_gpuq, env, "--version")  # in-process: the Python stub refuses too
        assert result.returncode == 0 and result.stdout.startswith(b"gpuq, version")
    finally:
        folder.chmod(0o700)
        fake.close()
    assert len(fake.calls) == 1


def test_a_linked_folder_is_refused(
    c_gpuq: Path, folder: Path, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """XDG_RUNTIME_DIR/gpuq a symbolic link to a private folder: neither stub uses it."""
    env = base_env(folder)
    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", [0], sleeper.pid)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0  # links
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        (other / "gpuq").symlink_to(folder)
        result = run(c_gpuq, {**env, "XDG_RUNTIME_DIR": str(other)}, "--version")
        assert result.returncode == 0 and result.stdout.startswith(b"gpuq, version")
    finally:
        fake.close()
    assert len(fake.calls) == 1


def test_a_link_out_of_the_folder_is_not_followed(
    c_gpuq: Path, folder: Path, sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Only a link to cli-KEY.sock in the folder itself: another socket is never reached (the
    Python stub, run instead, links its own again)."""
    env = base_env(folder)
    key = installation_key(env)
    fake = FakeHelper(folder / f"cli-{key}.sock", [0], sleeper.pid)
    decoy_folder = tmp_path / "elsewhere"
    decoy_folder.mkdir()
    decoy = FakeHelper(decoy_folder / f"cli-{key}.sock", [0], sleeper.pid)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0
        (link,) = links(folder)
        for target in (str(decoy.path), f"../../elsewhere/cli-{key}.sock"):
            link.unlink()
            link.symlink_to(target)
            assert run(c_gpuq, env, "queue").returncode == 0
            assert os.readlink(link) == f"cli-{key}.sock"  # the Python stub's, again
    finally:
        fake.close()
        decoy.close()
    assert decoy.calls == []
    assert [call.exe for call in fake.calls] == [os.path.realpath(sys.executable)] * 3


def test_signals_reach_the_child_and_its_status_is_the_exit(
    c_gpuq: Path, folder: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """SIGTERM to the stub goes to the child (the PID answer's); a child killed by a signal
    is 128 + its number; a helper gone before EXIT: the stub waits for the child, says so."""
    env = base_env(folder)

    def killed_by_term(conn: socket.socket) -> None:
        conn.sendall(protocol.answer(protocol.PID, sleeper.pid))
        sleeper.wait(20)  # until the stub forwarded SIGTERM
        conn.sendall(protocol.answer(protocol.EXIT, sleeper.returncode and -sleeper.returncode))

    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", [0, killed_by_term], 0)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0  # links
        process = subprocess.Popen([c_gpuq, "logs", "-f", "1"], env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while len(fake.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the stub has the PID answer and its handlers
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 128 + signal.SIGTERM
    finally:
        fake.close()
    assert sleeper.returncode == -signal.SIGTERM


def test_a_helper_gone_mid_call_leaves_the_status_unknown(
    c_gpuq: Path, folder: Path, tmp_path: Path
) -> None:
    env = base_env(folder)
    child = subprocess.Popen(["sleep", "0.5"])

    def vanish(conn: socket.socket) -> None:
        conn.sendall(protocol.answer(protocol.PID, child.pid))

    fake = FakeHelper(folder / f"cli-{installation_key(env)}.sock", [0, vanish], child.pid)
    try:
        assert run(c_gpuq, env, "queue").returncode == 0  # links
        began = time.monotonic()
        watcher = subprocess.Popen(
            [c_gpuq, "queue"], env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        child.wait(20)  # reaped here, so that the stub sees it gone
        _, stderr = watcher.communicate(timeout=20)
    finally:
        fake.close()
    assert watcher.returncode == 1
    said = b"gpuq: error: the CLI helper ended before the command; its status is unknown\n"
    assert stderr == said
    assert time.monotonic() - began >= 0.3


def test_only_a_right_guess_of_utf8_mode_is_linked(tmp_path: Path) -> None:
    """The C stub's guess of UTF-8 mode decides the streams it sends: a link made for a wrong
    guess would hand its calls to a helper whose interpreter disagrees."""
    path = str(tmp_path / "cli-0123456789abcdef.sock")
    wrong = 1 - sys.flags.utf8_mode
    protocol.link_stub(path, f"00000000000000aa:{wrong}:/bin/gpuq")
    protocol.link_stub(path, f"not-hex-at-all!!:{sys.flags.utf8_mode}:/bin/gpuq")
    protocol.link_stub(path, f"../../etc/passwd:{sys.flags.utf8_mode}:/bin/gpuq")
    assert list(tmp_path.iterdir()) == []
    protocol.link_stub(path, f"00000000000000aa:{sys.flags.utf8_mode}:/bin/gpuq")
    assert os.readlink(tmp_path / "stub-00000000000000aa.sock") == "cli-0123456789abcdef.sock"
