"""The node side of gpuq.Executor: `python -m gpuq.executor_worker RUN/N.fn`.

A job of the Executor runs this as its command. It loads the callable from `N.fn`, its
arguments from `N.args` (or `N.T.args` for task T of an array job, T from GPUQ_ARRAY_TASK_ID,
which the agent sets), calls it once per argument set, and writes `N.result` (or `N.T.result`):
the return values, or the exception with its traceback text. The result is written to a
temporary name and renamed, so the submitter never reads half a file. It exits 0 when the
call returned and 1 when it raised, so `gpuq history` shows the job as failed.

Pickles run code when loaded, so a file is loaded only when it is a regular file owned by the
user running the job and writable by no one else (checked with fstat on the open file, opened
without following a link): the job runs as its submitter, who wrote the payload.

It imports nothing heavy (no gRPC): it is the whole start-up cost of every Executor job.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys
import traceback
from pathlib import Path
from typing import Any

ARRAY_TASK_VARIABLE = "GPUQ_ARRAY_TASK_ID"  # gpuq.agent.launch.job_environment sets it
OK, ERROR = "ok", "error"  # the first field of a result


class UnsafeFile(Exception):
    """A payload or result file that must not be unpickled (someone else could have written it)."""


def read_trusted(path: Path) -> bytes:
    """The bytes of `path` if it is a regular file of ours that nobody else may write.

    Opened with O_NOFOLLOW and checked on the open descriptor, so a link or a file swapped in
    between the check and the read is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{path} is not a regular file")
        if info.st_uid != os.getuid():
            raise UnsafeFile(f"{path} belongs to uid {info.st_uid}, not to this user")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeFile(f"{path} is writable by others (mode {info.st_mode & 0o777:o})")
        with os.fdopen(fd, "rb") as file:
            fd = -1
            return file.read()
    finally:
        if fd >= 0:
            os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """`data` into `path`, readable by its owner only: written under a temporary name, then
    renamed over `path`, so a reader sees the whole file or none."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def task_paths(fn_path: Path, task: int | None) -> tuple[Path, Path]:
    """The arguments and result files that go with `N.fn` (for task `task` of an array)."""
    stem = fn_path.name.removesuffix(".fn")
    base = stem if task is None else f"{stem}.{task}"
    return fn_path.with_name(f"{base}.args"), fn_path.with_name(f"{base}.result")


def _load_callable(fn_path: Path) -> Any:
    """The callable; the submitter's sys.path entries are added (after ours) first, so the
    modules its pickle names by reference import here as they did there."""
    import cloudpickle

    outer = pickle.loads(read_trusted(fn_path))  # plain data: a list of paths and bytes
    for entry in outer["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    return cloudpickle.loads(outer["fn"])


def _error_result(index: int, error: BaseException) -> bytes:
    """The exception, pickled when it can be, with its traceback text either way."""
    import cloudpickle

    text = "".join(traceback.format_exception(error))
    pickled: bytes | None = None
    try:
        pickled = cloudpickle.dumps(error)
        pickle.loads(pickled)  # an exception that pickles but does not load is sent as text
    except Exception:
        pickled = None
    kind = f"{type(error).__module__}.{type(error).__qualname__}"
    return pickle.dumps((ERROR, index, pickled, text, kind, str(error)))


def run(fn_path: Path, task: int | None) -> int:
    """Call the function on each argument set of this job; write the result; the exit code."""
    import cloudpickle

    args_path, result_path = task_paths(fn_path, task)
    values: list[Any] = []
    try:
        fn = _load_callable(fn_path)
        calls = cloudpickle.loads(read_trusted(args_path))
        for args, kwargs in calls:
            values.append(fn(*args, **kwargs))
        data = cloudpickle.dumps((OK, values))
    except BaseException as error:  # KeyboardInterrupt and SystemExit too: the caller asks
        write_atomically(result_path, _error_result(len(values), error))
        traceback.print_exception(error)  # also into the job's output file
        return 1
    write_atomically(result_path, data)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpuq.executor_worker RUN_FOLDER/N.fn", file=sys.stderr)
        return 2
    task_text = os.environ.get(ARRAY_TASK_VARIABLE, "")
    return run(Path(args[0]), int(task_text) if task_text else None)


if __name__ == "__main__":
    sys.exit(main())
