"""The CLI fast path's protocol: where a `gpuq` process (the stub, gpuq.cli.fast.stub) finds
the per-user CLI helper, and every message the two, and the helper's own processes, exchange.

Where: a Unix socket $XDG_RUNTIME_DIR/gpuq/cli-KEY.sock when that runtime folder is ours and
0700, else /tmp/gpuq-cli-UID/cli-KEY.sock; the folder must be a real directory, ours, mode
0700 (made so when missing; someone else's is refused, never repaired). KEY (installation_key)
names the environment, interpreter, gpuq package and version and PYTHONPATH, so two virtual
environments or checkouts never share a helper. Beside the socket, cli-KEY.lock: the helper
holds a POSIX lock on it for life and writes its pid there. And stub-HASH.sock, links to
cli-KEY.sock for the installed C `gpuq` (gpuq/cli/fast/stub.c), which cannot compute KEY: HASH
names that program and what of its environment KEY could depend on; the Python stub, run by
it, makes the link (link_stub).

The stub's request, on a fresh connection (send_request / read_request):

    length (4 bytes, big-endian), then NUL-separated fields:
    MAGIC, umask, ignored signals (bit n: the caller ignores signal n of FORWARDED and
    SIGTSTP), groups (comma-separated), the encodings of stdin, stdout, stderr
    ("encoding:errors", "" for none), argc, argv[0..argc), then the environment (KEY=VALUE)
    with SCM_RIGHTS: the caller's fds 0, 1, 2 and its working folder (O_PATH)

Answers to the stub, 5 bytes each, a letter and a big-endian int (answer / read_answer):

    P pid     the child that runs the call (the stub forwards signals to it); the helper took it
    X status  the call ended: its wait status (from the child itself as soon as it closed the
              caller's fds, and again from the helper when the child was reaped)
    S 0       stale: the helper's code changed; the stub runs the call itself (the helper leaves)
    D 0       declined (other groups, other GRPC_* settings, an unknown stream encoding, a
              verb that must own its process: the C stub cannot tell); the stub runs it itself

A connection from another uid is closed without a word. Inside the helper, a spare (the child
forked ahead of the next call) tells the helper process on a socket pair (send_took /
read_spare_message): TOOK + the caller's settings variables (NUL-separated KEY=VALUE) with the
call's connection as SCM_RIGHTS, or LEFT when it found the code changed. TOOK_TO_RETURN in
place of TOOK: a call of a verb in gpuq.cli.verbs.PROCESS_REUSABLE, after which the child may
serve again; it says ENDED once that call ended cleanly, before it tells the stub the exit
code, and the helper answers SERVE_AGAIN (it counts as a spare again) or LEAVE (enough spares
wait, or the helper retired).

The stub imports this module before main(), so it imports nothing at module level beyond what
the interpreter has loaded already (os, sys, and the builtin _socket, _struct, _signal inside
functions): `python -X importtime` must show no new import.
"""

from __future__ import annotations

import os
import sys

from gpuq import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"GPUQCLI1"
# answers to the stub
PID, EXIT, STALE, DECLINED = b"P", b"X", b"S", b"D"
# spare -> helper process: took a call (its connection comes along); code changed, leaving
TOOK, LEFT = b"T", b"S"
# spare -> helper process: took a call and may serve again after it (its connection comes
# along); that call ended cleanly (gpuq.cli.fast.serve_again)
TOOK_TO_RETURN, ENDED = b"R", b"E"
# helper process -> a child whose call ended cleanly: be a spare again; leave
SERVE_AGAIN, LEAVE = b"A", b"L"
MAX_REQUEST = 16 << 20  # bytes of a request's fields
MAX_ENVIRON = 64 << 10  # bytes of the settings variables a spare passes on with TOOK
# the signals a terminal or a caller sends to `gpuq`, passed on to the child that runs it
FORWARDED = (1, 2, 3, 10, 12, 15, 18, 28)  # HUP INT QUIT USR1 USR2 TERM CONT WINCH
SIGTSTP, SIGSTOP = 20, 19
_FIXED_FIELDS = 8  # MAGIC .. argc
_S_IFMT, _S_IFDIR = 0o170000, 0o040000
# set by the C stub for the Python stub it runs: "HASH:UTF8:ARGV0" (see link_stub)
STUB_VAR = "GPUQ_CLI_STUB"
# the group's options that take a value (gpuq.cli.group.cli), skipped to find the verb
GROUP_OPTIONS_WITH_VALUE = ("--home", "--config")
_HEX = frozenset("0123456789abcdef")


# ---- where the helper's socket lives --------------------------------------------------------


def socket_path() -> str | None:
    """This user's and this installation's helper socket, or None when no folder is safe."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    folder = f"/tmp/gpuq-cli-{uid}"
    if runtime.startswith("/") and private_folder(runtime, uid):
        folder = runtime.rstrip("/") + "/gpuq"
    if not private_folder(folder, uid, create=True):
        return None
    return f"{folder}/cli-{installation_key()}.sock"


def lock_path(path: str) -> str:
    return path.removesuffix(".sock") + ".lock"


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


def link_stub(path: str, stub: str) -> None:
    """Link stub-HASH.sock to the socket `path` for the C stub that ran this process (`stub`:
    STUB_VAR's value). HASH names that program and the variables a Python start-up reads that
    KEY depends on, with its guess of UTF-8 mode: only a guess that matches this interpreter's
    is linked (a wrong one then never finds a helper, so it never reaches one started with
    other streams). Never fails the caller."""
    digest, _, rest = stub.partition(":")
    utf8_mode = rest.partition(":")[0]
    if len(digest) != 16 or not _HEX.issuperset(digest) or utf8_mode != str(sys.flags.utf8_mode):
        return
    folder, name = os.path.split(path)
    link = f"{folder}/stub-{digest}.sock"
    try:
        if os.readlink(link) == name:
            return
    except OSError:
        pass
    temporary = f"{link}.{os.getpid()}.tmp"
    try:
        os.symlink(name, temporary)
        os.rename(temporary, link)
    except OSError:
        try:  # noqa: SIM105 - contextlib is an import the stub does without
            os.unlink(temporary)
        except OSError:
            pass


def command_of(args: list[str]) -> str | None:
    """The command named in `args`, past the group's own options (`--home X serve`)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in GROUP_OPTIONS_WITH_VALUE:
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return arg
    return None


def installation_key() -> str:
    """FNV-1a 64 of what makes two helpers different code (no hashlib: it costs an import)."""
    here = os.path.abspath(__file__)  # gpuq/cli/fast/protocol.py
    package = os.path.dirname(os.path.dirname(os.path.dirname(here)))
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


# ---- the request ---------------------------------------------------------------------------


def send_request(sock: Any, args: list[str]) -> int:
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


class Request:
    """What a stub sends (send_request)."""

    __slots__ = ("argv", "encodings", "environ", "fds", "groups", "ignored", "umask")

    def __init__(
        self,
        umask: int,
        ignored: int,
        groups: list[int],
        encodings: list[str],
        argv: list[str],
        environ: list[tuple[bytes, bytes]],
        fds: list[int],
    ) -> None:
        self.umask = umask
        self.ignored = ignored  # bit n: the caller ignores signal n
        self.groups = groups
        self.encodings = encodings  # stdin, stdout, stderr: "encoding:errors", or "" for none
        self.argv = argv
        self.environ = environ
        self.fds = fds  # the caller's 0, 1, 2 and working folder


def read_request(conn: Any) -> Request:
    """One request: a length, NUL-separated fields, and four fds (SCM_RIGHTS)."""
    import _socket
    import _struct

    data, ancillary, flags, _ = conn.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += _struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
    try:
        if len(fds) != 4 or flags & _socket.MSG_CTRUNC or len(data) < 4:
            raise ValueError("a request needs its four fds")
        (size,) = _struct.unpack("!I", data[:4])
        if size > MAX_REQUEST:
            raise ValueError("request too large")
        body = bytearray(data[4:])
        while len(body) < size:
            chunk = conn.recv(min(1 << 20, size - len(body)))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
        return parse_request(bytes(body), fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def parse_request(body: bytes, fds: list[int]) -> Request:
    fields = body.split(b"\0")
    if fields[0] != MAGIC or len(fields) < _FIXED_FIELDS + 1:
        raise ValueError("not a gpuq CLI request")
    argc = int(fields[7])
    argv = [os.fsdecode(arg) for arg in fields[8 : 8 + argc]]
    environ = []
    for entry in fields[8 + argc :]:
        key, sep, value = entry.partition(b"=")
        if key and sep:
            environ.append((key, value))
    return Request(
        umask=int(fields[1]) & 0o777,
        ignored=int(fields[2]),
        groups=[int(g) for g in fields[3].split(b",") if g],
        encodings=[f.decode("ascii", "replace") for f in fields[4:7]],
        argv=argv,
        environ=environ,
        fds=fds,
    )


# ---- answers to the stub -------------------------------------------------------------------


def answer(kind: bytes, value: int = 0) -> bytes:
    """One answer: PID with the child's pid, EXIT with a wait status, STALE or DECLINED."""
    import _struct

    data: bytes = kind + _struct.pack("!i", value)
    return data


def read_answer(sock: Any) -> tuple[bytes, int]:
    """The next answer on the stub's connection; ConnectionResetError when it closed."""
    import _struct

    data = b""
    while len(data) < 5:
        chunk = sock.recv(5 - len(data))
        if not chunk:
            raise ConnectionResetError("the helper closed the connection")
        data += chunk
    return data[:1], int(_struct.unpack("!i", data[1:])[0])


# ---- inside the helper: a spare to the helper process --------------------------------------


def send_took(control: Any, conn_fd: int, settings: bytes, returns: bool = False) -> None:
    """Tell the helper process that this spare took the call on `conn_fd` (the fd goes
    along); `settings`: the caller's settings variables, for the next spare's warm client;
    `returns`: it may serve again after this call (TOOK_TO_RETURN)."""
    import _socket
    import _struct

    fd = _struct.pack("i", conn_fd)
    kind = TOOK_TO_RETURN if returns else TOOK
    control.sendmsg([kind + settings], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd)])


def read_spare_message(control: Any) -> tuple[bytes, list[int]]:
    """What a spare said (TOOK + settings, LEFT; b"" when it died) and the fds it sent."""
    import _socket
    import _struct

    try:
        message, ancillary, _, _ = control.recvmsg(MAX_ENVIRON, _socket.CMSG_SPACE(4))
    except OSError:
        message, ancillary = b"", []
    fds = [
        int(_struct.unpack("i", data[:4])[0])
        for level, kind, data in ancillary
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4
    ]
    return message, fds
