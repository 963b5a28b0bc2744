"""The job's processes: starting the main one, then finding, signalling and measuring all.

A supervisor is a child subreaper, so whatever a job starts stays below it: a double-forked,
setsid'ed daemon is re-parented to the supervisor, not to init. Walking
`/proc/<pid>/task/<tid>/children` down from the supervisor therefore finds the whole job, even
the processes that left its process group. These functions are cheap when there is nothing to
find (one read), because the common job leaves nothing behind.

The main process starts with posix_spawn (vfork: no page-table copy, no copy-on-write faults,
about a third of a fork+exec here) unless it must join a cgroup or change user before exec;
then a plain fork runs those steps and reports a failing one through a close-on-exec pipe.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pwd
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuq.agent.launch import LaunchSpec

PR_SET_CHILD_SUBREAPER = 36
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_PF_EXITING = 0x4  # task flag (stat field 9): the process is in exit
_DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}

# signal.signal turns the old handler into an enum member, and when that handler is a function
# the failed enum lookup costs ~80 us per call (a raised and caught ValueError): a supervisor's
# whole budget is ~2 ms. The C function it wraps does the same without the conversion.
set_handler: Callable[[int, Any], object] = getattr(signal.signal, "__wrapped__", signal.signal)


# loaded at import, i.e. once in the fork server, not once per supervisor
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
_PRCTL.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_PRCTL.restype = ctypes.c_int


def become_subreaper() -> None:
    """Make orphaned descendants re-parent to this process instead of init."""
    if _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def spawn_job(spec: LaunchSpec, script: Path, cgroup_fd: int | None) -> tuple[int, str | None]:
    """Start the job's main process in its own process group, stdin from /dev/null.

    (pid, None) once exec succeeded; (pid, reason) when a step failed, pid 0 when no child is
    left to reap. Relative output paths are relative to the job's cwd, on both paths.
    """
    if cgroup_fd is None and spec.uid is None and spec.gid is None:
        return _spawn_fast(spec, script)
    return _fork_exec(spec, script, cgroup_fd)


def _spawn_fast(spec: LaunchSpec, script: Path) -> tuple[int, str | None]:
    """posix_spawn; the supervisor opens the files and takes the cwd for the spawn's moment."""
    fds: list[int] = []
    step = f"chdir to {spec.cwd}"
    try:
        os.chdir(spec.cwd)
        fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        flags = _output_flags(spec)
        step = f"open {spec.stdout_path}"
        fds.append(os.open(spec.stdout_path, flags, 0o600))
        step = f"open {spec.stderr_path}"
        same = spec.stderr_path == spec.stdout_path
        fds.append(fds[1] if same else os.open(spec.stderr_path, flags, 0o600))
        step = f"execute {script}"
        dup2 = os.POSIX_SPAWN_DUP2
        actions = [(dup2, fds[0], 0), (dup2, fds[1], 1), (dup2, fds[2], 2)]
        pid = os.posix_spawn(
            script,
            [str(script), *spec.args],
            spec.env,
            file_actions=actions,
            setpgroup=0,
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    except OSError as exc:
        return 0, f"launch failed: cannot {step}: {os.strerror(exc.errno or errno.EIO)}"
    finally:
        for fd in set(fds):
            os.close(fd)
        os.chdir("/")  # do not hold the job's folder busy while waiting for an ack
    return pid, None


def _output_flags(spec: LaunchSpec) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    return flags | (os.O_APPEND if spec.open_mode == "append" else os.O_TRUNC)


def _fork_exec(spec: LaunchSpec, script: Path, cgroup_fd: int | None) -> tuple[int, str | None]:
    """Fork, run the steps posix_spawn cannot, exec; a failing step comes back through a pipe
    (`step NUL errno`): EOF without data means exec happened. A failed child is left to reap."""
    groups = _groups_for(spec)
    read_fd, write_fd = os.pipe()  # both close-on-exec
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or _exits
        try:
            _child(spec, script, cgroup_fd, groups, write_fd)
        finally:
            os._exit(127)
    os.close(write_fd)
    report = b""
    while chunk := os.read(read_fd, 4096):
        report += chunk
    os.close(read_fd)
    if not report:
        return pid, None
    step, _, number = report.decode(errors="replace").partition("\0")
    return pid, f"launch failed: cannot {step}: {os.strerror(int(number or 0))}"


def _groups_for(spec: LaunchSpec) -> list[int] | None:
    """Supplementary groups for a job that runs as another user (looked up before the fork)."""
    if spec.uid is None:
        return None
    gid = spec.gid if spec.gid is not None else os.getgid()
    try:
        name = pwd.getpwuid(spec.uid).pw_name
    except KeyError:
        return [gid]
    return sorted(set(os.getgrouplist(name, gid)))


def _child(
    spec: LaunchSpec, script: Path, cgroup_fd: int | None, groups: list[int] | None, err_fd: int
) -> None:
    step = "create a process group"
    try:
        os.setpgid(0, 0)
        if cgroup_fd is not None:
            step = "join the memory cgroup"
            os.write(cgroup_fd, str(os.getpid()).encode())
        target: int | Path = script
        if groups is not None or spec.gid is not None:
            step = "switch user"
            if groups is not None:
                # the job folder is root's: exec the script through an fd opened as root
                target = os.open(script, os.O_RDONLY)
                os.set_inheritable(target, True)
            os.setgroups(groups if groups is not None else [])
            if spec.gid is not None:
                os.setgid(spec.gid)
            if spec.uid is not None:
                os.setuid(spec.uid)
        step = f"chdir to {spec.cwd}"
        os.chdir(spec.cwd)
        os.dup2(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), 0)
        flags = _output_flags(spec)
        step = f"open {spec.stdout_path}"
        out = os.open(spec.stdout_path, flags, 0o600)
        step = f"open {spec.stderr_path}"
        same = spec.stderr_path == spec.stdout_path
        err = out if same else os.open(spec.stderr_path, flags, 0o600)
        os.dup2(out, 1)
        os.dup2(err, 2)
        _reset_signals()
        step = f"execute {script}"
        os.execve(target, [str(script), *spec.args], spec.env)
    except OSError as exc:
        os.write(err_fd, f"{step}\0{exc.errno or 0}".encode())
    except BaseException:
        os.write(err_fd, f"{step}\0{errno.EINVAL}".encode())


def _reset_signals() -> None:
    """Default signal handling for the job: exec keeps ignored signals ignored, and Python
    ignores SIGPIPE and SIGXFSZ."""
    for sig in _DEFAULT_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def children_of(pid: int, single_thread: bool = False) -> list[int]:
    """Direct children of `pid` (all its threads' children); [] when it is gone.

    `single_thread` skips listing the task folder, for a caller that knows `pid` has one thread
    (the supervisor itself), which makes the common empty check a single read.
    """
    try:
        tids = [str(pid)] if single_thread else os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        found.extend(int(word) for word in read_proc(f"/proc/{pid}/task/{tid}/children").split())
    return found


def read_proc(path: str) -> bytes:
    """A /proc or /sys file's content, b"" when it is gone: plain os calls, no file objects,
    because the supervisor reads a few of these per job."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def descendants(root: int) -> list[int]:
    """Every process below `root` (which must be this process or single-threaded), depth first."""
    found: list[int] = []
    stack = children_of(root, single_thread=True)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children_of(pid))
    return found


def has_exited(pid: int) -> bool:
    """True when `pid` is gone, a zombie, or already in exit (PF_EXITING): a process that a
    signal has killed but that is still freeing its memory is not a survivor."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return True
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0] in (b"Z", b"X", b"x") or bool(int(fields[6]) & _PF_EXITING)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, a unique identity."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19])  # field 22 of stat; fields[0] here is field 3


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group `pgid`."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_tree(root: int, pgid: int, sig: int, extra: Iterable[int] = ()) -> list[int]:
    """Deliver `sig` once to every process of the job; return the pids signalled one by one.

    The process group gets it atomically with killpg (no child forked meanwhile can miss it);
    descendants that left the group (setsid, setpgid) and `extra` pids (a cgroup's members) get
    it by pid, each exactly once, so a trapping shell never sees the signal twice.
    """
    if pgid > 0:  # never 0: killpg(0) would hit the supervisor's own group
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
    sent: list[int] = []
    for pid in {*descendants(root), *extra}:
        try:
            if os.getpgid(pid) == pgid:
                continue
            os.kill(pid, sig)
            sent.append(pid)
        except OSError:
            continue
    return sent


def living(pids: Iterable[int]) -> list[int]:
    """The pids of `pids` that have not exited (see has_exited)."""
    return [pid for pid in pids if not has_exited(pid)]


def tree_rss(pids: Iterable[int]) -> int:
    """Resident memory of `pids` in bytes (sum of statm resident pages; shared pages count twice,
    as with SLURM's jobacct_gather/linux, which errs towards killing a job that forks a lot)."""
    total = 0
    for pid in pids:
        try:
            total += int(read_proc(f"/proc/{pid}/statm").split()[1])
        except (IndexError, ValueError):
            continue
    return total * _PAGE_SIZE


def signal_name(sig: int) -> str:
    """`SIGSEGV` for 11, `signal 64` for a number without a name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
