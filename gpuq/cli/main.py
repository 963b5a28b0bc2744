"""The `gpuq` command's entry point: a lean stub in front of a persistent per-user CLI helper.

Importing click, grpc and the protobuf descriptors costs several times what starting Python
does, and a person types `gpuq status` dozens of times a day. So `main()` imports nothing but
what the interpreter already has (os, sys, _socket, _signal, _struct), hands its argv,
environment, umask, working folder and stdio to a helper process of the same user that has the
CLI loaded (gpuq.cli.helper), and waits for the exit status; the helper forks a child that
becomes this call and runs the one CLI (gpuq.cli.commands.run). Signals are forwarded to that
child. Without a helper (the first call, `GPUQ_CLI_HELPER=off`, a daemon command, a folder that
is not safely ours) the command runs here, the slow way, and a helper is started for next time.
The exit codes are gpuq.cli.commands'.

Rules kept here: no import beyond the builtins on the fast path (`python -X importtime`), the
socket folder is trusted only when it is a real directory, ours, mode 0700, and anything that
goes wrong before the helper said it runs the command falls back to the slow path in silence.
"""

from __future__ import annotations

import os
import sys

from gpuq import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# each command's module loads only when that command runs (the CLI must start fast)
COMMANDS = {
    "submit": "gpuq.cli.jobs",
    "status": "gpuq.cli.listings",
    "queue": "gpuq.cli.listings",
    "show": "gpuq.cli.jobs",
    "cancel": "gpuq.cli.jobs",
    "hold": "gpuq.cli.jobs",
    "release": "gpuq.cli.jobs",
    "logs": "gpuq.cli.jobs",
    "update": "gpuq.cli.edit",
    "requeue": "gpuq.cli.edit",
    "run": "gpuq.cli.interactive",
    "alloc": "gpuq.cli.interactive",
    "history": "gpuq.cli.listings",
    "report": "gpuq.cli.listings",
    "web": "gpuq.cli.web",
    "nodes": "gpuq.cli.listings",
    "completion": "gpuq.cli.completion",
    "cron": "gpuq.cli.cron_verbs",
    "drain": "gpuq.cli.admin",
    "resume": "gpuq.cli.admin",
    "admin": "gpuq.cli.security",
    "serve": "gpuq.cli.daemon_verbs",
    "coordinator": "gpuq.cli.daemon_verbs",
    "agent": "gpuq.cli.daemon_verbs",
}
# commands whose process must not be a fork of a long-lived helper: the daemons (they own
# sockets, threads, logging and children for hours). A command that needs the controlling
# terminal itself (job control, a local interactive shell) belongs here too.
BYPASS = frozenset({"serve", "coordinator", "agent"})
HELPER_VAR = "GPUQ_CLI_HELPER"  # off: never use or start a helper; debug: say which path ran
IDLE_VAR = "GPUQ_CLI_HELPER_IDLE"  # seconds a helper waits for the next call (default 600)
OFF_VALUES = frozenset({"off", "0", "no", "false"})
# the signals a terminal or a caller sends to `gpuq`, passed on to the child that runs it
FORWARDED = (1, 2, 3, 10, 12, 15, 18, 28)  # HUP INT QUIT USR1 USR2 TERM CONT WINCH
SIGTSTP, SIGSTOP = 20, 19
# answers of the helper: 5 bytes each, a letter and a big-endian int
PID, EXIT, STALE, DECLINED = b"P", b"X", b"S", b"D"
MAGIC = b"GPUQCLI1"
_S_IFMT, _S_IFDIR = 0o170000, 0o040000


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: through the helper when one answers, else here; then leave at once (a
    client command has nothing to clean up, and tearing grpc down costs a visible 30 ms)."""
    args = sys.argv[1:] if argv is None else list(argv)
    mode = os.environ.get(HELPER_VAR, "").lower()
    path = None
    if mode not in OFF_VALUES and command_of(args) not in BYPASS:
        path = socket_path()
        if path is not None:
            code = _through_helper(path, args, debug=mode == "debug")
            if code is not None:
                os._exit(code)
            if mode == "debug":
                os.write(2, b"gpuq: cli helper: none answered; the slow path, and one starts\n")
    _slow_path(args, path)


def __getattr__(name: str) -> Any:
    """`gpuq.cli.main.run`, `cli`, `Context`, ... as before the split: they live in
    gpuq.cli.commands, loaded only when asked for (the stub must not import click)."""
    if name.startswith("__"):
        raise AttributeError(name)
    from gpuq.cli import commands

    try:
        return getattr(commands, name)
    except AttributeError:
        raise AttributeError(f"module 'gpuq.cli.main' has no attribute {name!r}") from None


def command_of(args: list[str]) -> str | None:
    """The command named in `args`, past the group's own options (`--home X serve`)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--home", "--config"):
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return arg
    return None


# ---- where the helper's socket lives --------------------------------------------------------


def socket_path() -> str | None:
    """This user's and this installation's helper socket, or None when no folder is safe.

    $XDG_RUNTIME_DIR/gpuq when the runtime folder is ours and 0700, else /tmp/gpuq-cli-UID. The
    name carries a key of the environment and interpreter, the gpuq package and version and
    PYTHONPATH, so two virtual environments or checkouts never share a helper."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    folder = f"/tmp/gpuq-cli-{uid}"
    if runtime.startswith("/") and private_folder(runtime, uid):
        folder = runtime.rstrip("/") + "/gpuq"
    if not private_folder(folder, uid, create=True):
        return None
    return f"{folder}/cli-{installation_key()}.sock"


def private_folder(folder: str, uid: int, create: bool = False) -> bool:
    """Whether `folder` is a real directory (not a link), owned by `uid`, mode 0700; made so
    when `create` and it does not exist. Someone else's folder is refused, never repaired."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        if not create:
            return False
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o700)  # whatever the umask says
            st = os.lstat(folder)
        except OSError:
            return False
    except OSError:
        return False
    return st.st_mode & _S_IFMT == _S_IFDIR and st.st_uid == uid and st.st_mode & 0o7777 == 0o700


def installation_key() -> str:
    """FNV-1a 64 of what makes two helpers different code (no hashlib: it costs an import)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = "\0".join(
        (
            sys.prefix,  # the environment (python and python3 in one venv are one)
            str(sys.hexversion),
            package,
            __version__,
            os.environ.get("PYTHONPATH", ""),
            str(sys.flags.utf8_mode),
        )
    )
    value = 0xCBF29CE484222325
    for byte in os.fsencode(text):
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


# ---- the fast path -------------------------------------------------------------------------


def _through_helper(path: str, args: list[str], debug: bool) -> int | None:
    """Run the command in the helper: its exit code, or None when the helper did not start it
    (none listens, it is stale, it declined), so that the caller runs it here instead."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
        ignored = _send_request(sock, args)
        kind, pid = _answer(sock)
    except OSError:
        sock.close()
        return None
    if kind != PID:
        sock.close()
        return None
    if debug:
        os.write(2, f"gpuq: cli helper: child {pid}\n".encode())
    _forward_signals(pid, ignored)
    try:
        kind, status = _answer(sock)
    except OSError:
        kind, status = b"", 0
    if kind != EXIT:
        return _orphaned(pid)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _send_request(sock: Any, args: list[str]) -> int:
    """Send argv, environment, umask, stdio encodings and fds 0, 1, 2 and the working folder;
    the set of forwarded signals this process ignores (the child ignores them too)."""
    import _signal  # type: ignore[import-not-found]
    import _socket
    import _struct

    ignored = 0
    for number in (*FORWARDED, SIGTSTP):
        if _signal.getsignal(number) == _signal.SIG_IGN:
            ignored |= 1 << number
    mask = os.umask(0o022)
    os.umask(mask)
    fields = [
        MAGIC,
        b"%d" % mask,
        b"%d" % ignored,
        b",".join(b"%d" % g for g in os.getgroups()),
        *(_encoding(stream) for stream in (sys.stdin, sys.stdout, sys.stderr)),
        b"%d" % (len(args) + 1),
        os.fsencode(sys.argv[0] if sys.argv else "gpuq"),
        *(os.fsencode(arg) for arg in args),
        *(key + b"=" + value for key, value in os.environb.items()),
    ]
    body = b"\0".join(fields)
    payload = _struct.pack("!I", len(body)) + body
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fds = _struct.pack("4i", 0, 1, 2, cwd)
        sent = sock.sendmsg([payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    finally:
        os.close(cwd)
    if sent < len(payload):
        sock.sendall(payload[sent:])
    return ignored


def _encoding(stream: Any) -> bytes:
    """`encoding:errors` of a std stream as this interpreter set it up (PYTHONIOENCODING,
    the locale, UTF-8 mode), for the child's own streams."""
    if stream is None:
        return b""
    return f"{stream.encoding}:{stream.errors}".encode()


def _answer(sock: Any) -> tuple[bytes, int]:
    import _struct

    data = b""
    while len(data) < 5:
        chunk = sock.recv(5 - len(data))
        if not chunk:
            raise ConnectionResetError("the helper closed the connection")
        data += chunk
    return data[:1], int(_struct.unpack("!i", data[1:])[0])


def _forward_signals(pid: int, ignored: int) -> None:
    """Pass on what a terminal or a caller sends (same uid: os.kill may). Ctrl-Z stops the
    child (its own process group ignores SIGTSTP: it has no terminal) and then this stub."""
    import _signal

    def forward(number: int, frame: object) -> None:
        _kill(pid, number)

    def suspend(number: int, frame: object) -> None:
        _kill(pid, SIGSTOP)
        _signal.signal(SIGTSTP, _signal.SIG_DFL)
        os.kill(os.getpid(), SIGTSTP)  # stops here; SIGCONT (forwarded) resumes both
        _signal.signal(SIGTSTP, suspend)

    for number in FORWARDED:
        if not ignored & (1 << number):
            _signal.signal(number, forward)
    if not ignored & (1 << SIGTSTP):
        _signal.signal(SIGTSTP, suspend)


def _kill(pid: int, number: int) -> None:
    try:  # noqa: SIM105 - contextlib is an import the stub does without
        os.kill(pid, number)
    except OSError:
        pass


def _orphaned(pid: int) -> int:
    """The helper went away while the child ran: wait for the child, whose status is lost."""
    import time

    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except OSError:
            break
        time.sleep(0.05)
    os.write(2, b"gpuq: error: the CLI helper ended before the command; its status is unknown\n")
    return 1


# ---- the slow path -------------------------------------------------------------------------


def _slow_path(args: list[str], path: str | None) -> NoReturn:
    """Run the command in this process; then, when `path` is set, start a helper for next
    time (after the command, so that the two do not compete for the CPU)."""
    from gpuq.cli.commands import run

    code = run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    if path is not None:
        from gpuq.cli.helper import start_helper

        start_helper(path)
    os._exit(code)


if __name__ == "__main__":
    main()
