"""Interactive jobs on the node: the supervisor's pseudo-terminal and the hub's relay of it.

Real fork server, supervisors, processes, signals and terminals (gpuq/agent/native/supervisor.c,
gpuq/agent/jobs/pty_relay.py). Every wait has a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import struct
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import skip_or_fail
from supervisor_helpers import PY, alive, await_until, cleanup, make_spec, read_pid

from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.agent.jobs.pty_relay import PTY_SOCKET, PtyEvent, fetch_master
from gpuq.agent.jobs.supervisor_reports import SupervisorReport
from gpuq.agent.jobs.supervisors import Supervisors

pytestmark = pytest.mark.timeout(60)
TIOCGPTN = 0x80045430  # the pty's number, asked of its master

# what a job sees of its terminal, then its input line by line, then all of it up to EOF
PROBE = """
import fcntl, os, signal, struct, sys, termios

def size():
    return struct.unpack("HH", fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(4)))

def on_winch(*_):
    print("winch %d %d" % size(), flush=True)

signal.signal(signal.SIGWINCH, on_winch)
print("tty", *[int(os.isatty(fd)) for fd in (0, 1, 2)], flush=True)
print("term", os.environ.get("TERM"), flush=True)
print("size %d %d" % size(), flush=True)
leader, foreground = os.getsid(0) == os.getpid(), os.tcgetpgrp(0) == os.getpgrp()
print("sid", int(leader), "fg", int(foreground), flush=True)
print("line", sys.stdin.readline().strip(), flush=True)
print("rest", repr(sys.stdin.read()), flush=True)
sys.exit(7)
"""


class Timeline:
    """Reports and terminal output of a hub, in the one order they came."""

    def __init__(self) -> None:
        self.items: list[SupervisorReport | PtyEvent] = []

    def report(self, report: SupervisorReport) -> None:
        self.items.append(report)

    def pty(self, event: PtyEvent) -> None:
        self.items.append(event)

    def output(self, job_id: int) -> bytes:
        return b"".join(
            e.data for e in self.items if isinstance(e, PtyEvent) and e.job_id == job_id
        )

    def events(self, job_id: int) -> list[PtyEvent]:
        return [e for e in self.items if isinstance(e, PtyEvent) and e.job_id == job_id]

    def end(self, job_id: int) -> SupervisorReport | None:
        return next(
            (
                r
                for r in self.items
                if isinstance(r, SupervisorReport) and r.job_id == job_id and r.kind == "ended"
            ),
            None,
        )

    async def wait_output(self, job_id: int, needle: bytes, timeout: float = 10.0) -> None:
        await await_until(
            lambda: needle in self.output(job_id),
            timeout,
            f"{needle!r} from job {job_id}; got {self.output(job_id)!r}",
        )

    async def wait_end(self, job_id: int, timeout: float = 15.0) -> SupervisorReport:
        await await_until(lambda: self.end(job_id) is not None, timeout, f"job {job_id}'s end")
        end = self.end(job_id)
        assert end is not None
        # everything the terminal gave came before the end, and closed exactly once, last
        index = self.items.index(end)
        later = [e for e in self.items[index:] if isinstance(e, PtyEvent) and e.job_id == job_id]
        assert later == [], later
        closed = [e for e in self.events(job_id) if e.closed]
        assert len(closed) == 1 and self.events(job_id)[-1] is closed[0], self.events(job_id)
        assert all(len(e.data) <= 65536 for e in self.events(job_id))
        return end


@contextlib.asynccontextmanager
async def relaying_hub(state: Path) -> AsyncIterator[tuple[Supervisors, Timeline]]:
    timeline = Timeline()
    hub = Supervisors(state, timeline.report, ack_wait=20.0, on_pty=timeline.pty)
    await hub.start()
    try:
        yield hub, timeline
    finally:
        await hub.close()


def terminal_spec(work: Path, job_id: int, script: str, **fields: Any) -> LaunchSpec:
    terminal = {"rows": 30, "cols": 100, "term": "xterm", "stdin_tty": True, "stdout_tty": True}
    terminal.update(fields.pop("terminal", {}))
    fields.setdefault("env", {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PY": PY})
    fields["env"] = {**fields["env"], "TERM": str(terminal["term"])}  # as build_launch sets it
    return make_spec(
        work, job_id, script, terminal=terminal, stdout_path="", stderr_path="", **fields
    )


def test_a_terminal_job_sees_its_terminal_and_gets_input(tmp_path: Path) -> None:
    """isatty 0/1/2, TERM, the window size and SIGWINCH on a resize, a session of its own in
    the foreground, input by line and up to EOF (VEOF twice after a partial line), its exit
    code; every byte of output before the end report, then closed."""
    state = tmp_path / "state"
    (tmp_path / "probe.py").write_text(PROBE)
    spec = terminal_spec(tmp_path, 1, 'exec "$PY" probe.py\n', terminal={"term": "vt220"})

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(spec)
            await timeline.wait_output(1, b"sid 1 fg 1")
            out = timeline.output(1)
            assert b"tty 1 1 1\r\n" in out and b"term vt220\r\n" in out
            assert b"size 30 100\r\n" in out
            assert hub.terminals.input(1, 0, rows=40, cols=120)
            await timeline.wait_output(1, b"winch 40 120\r\n")
            assert hub.terminals.input(1, 0, data=b"hello\n")
            await timeline.wait_output(1, b"line hello\r\n")
            assert hub.terminals.input(1, 0, data=b"abc", eof=True)
            end = await timeline.wait_end(1)
            assert (end.end_state, end.exit_code) == ("failed", 7)
            assert b"hello\r\n" in timeline.output(1)  # echoed: the submitter's stdin is a tty
            assert timeline.output(1).endswith(b"rest 'abc'\r\n")
            assert not hub.terminals.input(1, 0, data=b"late")  # its relay is gone

    with cleanup(state):
        asyncio.run(scenario())


def test_ctrl_c_interrupts_and_piped_modes(tmp_path: Path) -> None:
    """^C on the terminal is SIGINT to the job's foreground group (the line discipline), and a
    submitter whose stdin and stdout are not terminals gets no echo and bare newlines."""
    state = tmp_path / "state"
    trapping = terminal_spec(
        tmp_path, 1, "trap 'echo got-int; exit 5' INT\necho ready\nwhile :; do sleep 0.05; done\n"
    )
    piped = terminal_spec(
        tmp_path,
        2,
        'read x\necho "got $x"\n',
        terminal={"stdin_tty": False, "stdout_tty": False},
    )

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(trapping)
            await hub.launch(piped)
            await timeline.wait_output(1, b"ready\r\n")
            assert hub.terminals.input(1, 0, data=b"\x03")
            end = await timeline.wait_end(1)
            assert (end.end_state, end.exit_code) == ("failed", 5)
            assert b"got-int" in timeline.output(1)
            assert hub.terminals.input(2, 0, data=b"secret\n")
            end = await timeline.wait_end(2)
            assert end.end_state == "completed"
            assert timeline.output(2) == b"got secret\n"

    with cleanup(state):
        asyncio.run(scenario())


def test_time_limit_and_leftovers_still_apply(tmp_path: Path) -> None:
    """The time limit ends a terminal job (SIGTERM ignored: SIGKILL after the grace), and a
    process a finished job left on the terminal is killed; its output still comes first."""
    state = tmp_path / "state"
    stubborn = terminal_spec(
        tmp_path,
        1,
        "trap '' TERM\necho started\nwhile :; do sleep 0.05; done\n",
        time_limit=1.0,
        kill_grace=0.3,
    )
    leaving = terminal_spec(
        tmp_path,
        2,
        "setsid sh -c 'echo $$ > daemon.pid; sleep 0.2; echo from-daemon; exec sleep 1000' &\n"
        "while [ ! -s daemon.pid ]; do sleep 0.01; done\n"
        'while :; do sleep 0.05; case "$(cat done 2>/dev/null)" in y) break;; esac; done\n'
        "echo main-done\n",
    )

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(stubborn)
            await hub.launch(leaving)
            await timeline.wait_output(1, b"started")
            end = await timeline.wait_end(1)
            assert (end.end_state, end.reason) == ("timeout", "time limit 00:00:01 reached")
            assert end.signal == signal.SIGKILL
            await timeline.wait_output(2, b"from-daemon")
            (tmp_path / "done").write_text("y")
            end = await timeline.wait_end(2)
            assert (end.end_state, end.leftovers_killed) == ("completed", 1)
            assert b"main-done" in timeline.output(2)
            assert not alive(read_pid(tmp_path / "daemon.pid"))

    with cleanup(state, tmp_path / "daemon.pid"):
        asyncio.run(scenario())


def test_an_agent_that_restarts_gets_the_same_terminal(tmp_path: Path) -> None:
    """pty.sock hands the master to every connection of its user: a second one gets the same
    terminal; a hub that stops leaves the job running (no hangup: the supervisor holds the
    master), and the next hub relays its terminal again."""
    state = tmp_path / "state"
    script = 'echo $$ > main.pid\nread x\necho "after $x"\nread y\necho "then $y"\n'
    spec = terminal_spec(tmp_path, 1, script)

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, first):
            await hub.launch(spec)
            main = await asyncio.to_thread(read_pid, tmp_path / "main.pid")
            await await_until(lambda: hub.terminals.relays[1].fd is not None, what="the relay")
            relay_fd = hub.terminals.relays[1].fd
            assert relay_fd is not None
            second = await fetch_master(state / "jobs" / "1")
            try:
                assert pty_number(second) == pty_number(relay_fd)
                os.write(second, b"one\n")  # typed through the second connection
                await first.wait_output(1, b"after one")
            finally:
                os.close(second)
        assert alive(main)
        async with relaying_hub(state) as (hub, again):
            await await_until(lambda: 1 in hub.terminals.relays, what="the job adopted")
            await await_until(lambda: hub.terminals.relays[1].fd is not None, what="the relay")
            assert hub.terminals.input(1, 0, data=b"two\n")
            end = await again.wait_end(1)
            assert end.end_state == "completed"
            assert b"then two" in again.output(1)

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())


def pty_number(master: int) -> int:
    return int(struct.unpack("I", fcntl.ioctl(master, TIOCGPTN, bytes(4)))[0])


def test_another_uid_gets_no_terminal(tmp_path: Path) -> None:
    """pty.sock is 0600, the supervisor's; even where another user could connect, the
    supervisor checks SO_PEERCRED and answers it without the fd."""
    if os.geteuid() != 0:
        skip_or_fail("needs root (to be another user)")
    state = tmp_path / "state"
    spec = terminal_spec(tmp_path, 1, "read x\n")

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(spec)
            sock = state / "jobs" / "1" / PTY_SOCKET
            await await_until(sock.exists, what="pty.sock")
            info = sock.stat()
            assert (oct(info.st_mode & 0o777), info.st_uid) == ("0o600", os.geteuid())
            sock.chmod(0o666)  # as a mistake might leave it
            answer = await asyncio.to_thread(connect_as, 65534, 65534, str(sock))
            assert answer == "refused b'N' 0", answer
            hub.terminals.input(1, 0, data=b"\n")
            assert (await timeline.wait_end(1)).end_state == "completed"

    with cleanup(state):
        asyncio.run(scenario())


def connect_as(uid: int, gid: int, path: str) -> str:
    """Connect to `path` as uid/gid in a child process; what the supervisor answered."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            os.chdir(os.path.dirname(path))  # the test's folders above are root's alone
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(5)
                client.connect(os.path.basename(path))
                data, fds, _, _ = socket.recv_fds(client, 1, 1)
            os.write(write_end, f"refused {data!r} {len(fds)}".encode())
            code = 0
        except BaseException as error:
            with contextlib.suppress(BaseException):
                os.write(write_end, f"error {error!r}".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + 10
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() < deadline, "the child did not finish"
        time.sleep(0.01)
    with os.fdopen(read_end, "rb") as answer:
        return answer.read().decode()


@pytest.mark.parametrize(
    ("terminal", "problem"),
    [
        ({"rows": 70000, "cols": 80}, "terminal has rows or cols out of 0 to 65535"),
        ({"rows": -1, "cols": 80}, "terminal has rows or cols out of 0 to 65535"),
        ({"rows": 24.5, "cols": 80}, "terminal has rows or cols out of 0 to 65535"),
        ({"stdin_tty": "yes"}, "stdin_tty or stdout_tty that is not a boolean"),
        ("tty", "field terminal is not an object"),
    ],
)
def test_an_unusable_terminal_refuses_the_spec(
    tmp_path: Path, terminal: object, problem: str
) -> None:
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 1, "touch ran\n", terminal=terminal, stdout_path="")

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(spec)
            end = await timeline.wait_end(1)
            assert end.end_state == "failed" and problem in end.reason, end.reason

    with cleanup(state):
        asyncio.run(scenario())
    assert not (tmp_path / "ran").exists()


def test_input_waits_while_the_terminal_is_full_and_pause_stops_reading(tmp_path: Path) -> None:
    """Input the line discipline cannot take yet waits (bounded) and goes in as the job reads;
    a paused terminal is not read (the job blocks on its writes) until resumed."""
    state = tmp_path / "state"
    # raw mode, no echo: read everything, print the total; then write a lot
    program = (
        "import sys, termios, tty\n"
        "tty.setraw(0)\n"
        "print('raw', flush=True)\n"
        "got = 0\n"
        "while got < 300000:\n"
        "    got += len(sys.stdin.buffer.raw.read(65536))\n"
        "sys.stdout.write('total %d\\r\\n' % got); sys.stdout.flush()\n"
        "sys.stdin.buffer.raw.read(1)\n"
        "sys.stdout.buffer.write(b'x' * 200000); sys.stdout.flush()\n"
        "print('\\r\\nwritten', flush=True)\n"
    )
    (tmp_path / "raw.py").write_text(program)
    spec = terminal_spec(tmp_path, 1, 'exec "$PY" raw.py\n')

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(spec)
            await timeline.wait_output(1, b"raw")
            assert hub.terminals.input(1, 0, data=b"y" * 300000)
            await timeline.wait_output(1, b"total 300000")
            assert hub.terminals.input(1, 0, pause=True, data=b"g")
            # paused: at most what the kernel buffers leaves the terminal
            await asyncio.sleep(0.3)  # a pause shows only as nothing happening
            assert b"written" not in timeline.output(1)
            assert hub.terminals.input(1, 0, resume=True)
            await timeline.wait_output(1, b"written")
            assert timeline.output(1).count(b"x") == 200000
            assert (await timeline.wait_end(1)).end_state == "completed"

    with cleanup(state):
        asyncio.run(scenario())


def test_a_terminal_job_of_another_user_owns_its_terminal(tmp_path: Path) -> None:
    """As on a login: the job's user owns its pts (so /dev/tty opens and `mesg`-like checks
    pass), and the job runs as that user."""
    if os.geteuid() != 0:
        skip_or_fail("needs root")
    state = tmp_path / "state"
    shared = Path(tempfile.mkdtemp(prefix="gpuq-pty-"))  # tmp_path's parents are root-only
    shared.chmod(0o777)
    script = 'id -u\ntest -O "$(tty)" && echo owned\necho via-dev-tty > /dev/tty\n'
    spec = terminal_spec(shared, 1, script, uid=65534, gid=65534)

    async def scenario() -> None:
        async with relaying_hub(state) as (hub, timeline):
            await hub.launch(spec)
            assert (await timeline.wait_end(1)).end_state == "completed"
            assert timeline.output(1) == b"65534\r\nowned\r\nvia-dev-tty\r\n"

    try:
        with cleanup(state):
            asyncio.run(scenario())
    finally:
        shutil.rmtree(shared)
