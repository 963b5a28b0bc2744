"""Every bound on what one submission may say, and the checks of user text that enforce them.

One place for each number and each check, shared by the dataclasses (gpuq.domain.model,
.array_specs, .dependencies: what arrives over gRPC) and the submit side (gpuq.submission,
gpuq.directives: what a user typed), so both refuse the same value with the same InvalidInput.
An error shows the value through `shown` or `brief`: one short line, whatever was given.
"""

from __future__ import annotations

import re

from gpuq.errors import InvalidInput

MAX_ARRAY_TASKS = 100_000
MAX_ARRAY_INDEX = 10_000_000
MAX_JOB_ID = 2**53  # exact in a JSON number and a double; far beyond any real queue
# Bounds on what one submission may say, checked on construction (so over gRPC too): each keeps
# a single submission from costing the scheduler, the store or an agent more than it should.
MAX_TIME_LIMIT = 366 * 86400  # --time, and how long before it --signal may warn
MAX_MEM = 2**60  # --mem (1024P)
MAX_GPU_MEM = 2**50  # --gpu-mem (1P per GPU)
MAX_BEGIN_TIME = 4_102_444_800.0  # 2100-01-01T00:00:00Z: any clock and datetime can show it
MAX_PATH_BYTES = 4096  # --output, --error, --chdir, the script's path (Linux's PATH_MAX)
MAX_SCRIPT_BYTES = 4 << 20
MAX_ENV_BYTES = 1 << 20  # the whole environment, K=V entries counted in UTF-8 bytes
MAX_ARGS = 4096
MAX_ARGS_BYTES = 1 << 20
MAX_ARG_STRLEN = 128 << 10  # Linux's limit on one argument or one K=V (NUL included)
MAX_DEPENDENCIES = 1000
MAX_NICE = 10_000
MAX_ARRAY_TEXT = 1 << 20  # an array spec's text (the store keeps unstarted tasks this way)
MAX_REASON = 1000  # characters of a cancel, hold or drain reason
MAX_NODE_NAME = 63  # a node's name, as gpuq.config takes it ([agent] node_name)
MAX_NODE_UNITS = 1024  # GPUs and MIG slices one agent may register
MAX_TOPOLOGY_LINKS = 32768  # pairs of units with a distance (256 units, each pair once)
MAX_NODE_TEXT = 300  # an agent's driver, isolation or GPU-problem text; a GPU's name
MAX_UNIT_ID = 96  # a unit's UUID, PCI bus id or MIG profile
# The largest valid SubmitRequest on the wire: every part at its limit, with protobuf's
# framing (an environment of many tiny variables costs up to 7 bytes a 3-byte `K=`: 3x covers
# it; an empty argument 2 bytes for 1), 100,000 array indices of up to 5 bytes, 1000
# dependencies, the paths, and slack for the small fields. The coordinator's receive limit.
MAX_REQUEST_BYTES = (
    MAX_SCRIPT_BYTES
    + 3 * MAX_ENV_BYTES
    + MAX_ARGS_BYTES
    + 4 * MAX_ARGS
    + 4 * MAX_PATH_BYTES
    + 5 * MAX_ARRAY_TASKS
    + 32 * MAX_DEPENDENCIES
    + (64 << 10)
)
# One message on an agent's stream, either way: a launch of the largest valid job (its spec,
# 1024 GPU UUIDs, the rest) fits alone; the coordinator splits larger batches of launches
# (gpuq.coordinator.nodes.agent_session.AgentSession). The agent's receive limit. (What an
# agent sends, a registration at MAX_NODE_UNITS and MAX_TOPOLOGY_LINKS included, fits
# MAX_REQUEST_BYTES.)
MAX_AGENT_MESSAGE_BYTES = 16 << 20
BEGIN_MAX_AHEAD = 366 * 86400  # --begin further ahead than this is surely a typo
_QOS_RE = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
# characters that must never reach a terminal raw: C0 (newline, tab, ESC...), DEL, C1, and the
# Unicode ones that reorder or break what follows (bidi embeddings, overrides and isolates,
# the Arabic letter mark, line and paragraph separators)
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
CONTROL_RE = _CONTROL_RE
DIGITS_RE = re.compile(r"[0-9]+")


def brief(text: str) -> str:
    """`text` as an error may show it (one short line)."""
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def shown(value: object) -> object:
    """`value` as an error message may show it: long text cut, huge numbers summarised (the
    message must stay one short line; repr() of an int of 4,300+ digits even raises)."""
    if isinstance(value, str):
        return brief(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a number of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    return value


def bounded_number(digits: str, limit: int) -> int | None:
    """The value of ASCII `digits`, or None when it is above `limit` (decided before int()
    meets thousands of digits)."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(limit)):
        return None
    value = int(significant)
    return value if value <= limit else None


def check_range(name: str, value: int, low: int, high: int, problem: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(
            name, shown(value), problem or f"must be a whole number from {low} to {high}"
        )


def check_text(name: str, value: object, limit: int) -> None:
    """Text that can travel (UTF-8) and be shown: at most `limit` bytes, no NUL, no control
    characters (newlines, terminal escapes)."""
    if not isinstance(value, str):
        raise InvalidInput(name, shown(value), "must be text")
    if len(value) > limit:
        raise InvalidInput(name, shown(value), f"is longer than {limit} bytes")
    if "\0" in value:
        raise InvalidInput(name, shown(value), "contains a NUL byte")
    if bad := _CONTROL_RE.search(value):
        raise InvalidInput(name, shown(value), f"contains the control character {bad[0]!r}")
    if not value.isascii():
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise InvalidInput(name, shown(value), "is not valid UTF-8 text") from None
        if size > limit:
            raise InvalidInput(name, shown(value), f"is longer than {limit} bytes")


def check_name(value: str, field_name: str = "--name") -> str:
    """A job name: 1 to 128 printable characters, as SLURM takes them (spaces, `*`, `/` and
    any script's language included: `CS 601.471/671 homework5`); never a control character,
    a bidi override or anything else a terminal would act on. Wherever a name is shown it is
    shown as text (CLI listings through printable(), the dashboard as DOM text); in a file
    name (`%x`) its `/` becomes `_` (gpuq.domain.model.output_paths)."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(field_name, shown(value), "is empty")
    if len(value) > 128:
        raise InvalidInput(field_name, shown(value), "is longer than 128 characters")
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        kind = "control" if _CONTROL_RE.fullmatch(bad) or bad < " " else "unprintable"
        raise InvalidInput(field_name, shown(value), f"contains the {kind} character {bad!a}")
    return value


_PLAIN_NAME_RE = re.compile(r"[A-Za-z0-9_.+@=:,-]+")  # what names were before any was quoted
# a job name as name_in_text writes it: plain, or quoted (what job_messages.hide_names finds)
NAME_IN_TEXT = r"(?:[A-Za-z0-9_.+@=:,-]+|'(?:[^'\\]|\\.)*')"


def name_in_text(name: str) -> str:
    """A job name inside a sentence (a reason, an event): as is when it is one plain word,
    else in quotes (`'CS 601 hw5'`, `\\` and `'` escaped), so where a name ends stays clear,
    to a reader and to hiding it from those who may not see names."""
    if _PLAIN_NAME_RE.fullmatch(name):
        return name
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_qos(value: object) -> None:
    """A QOS tier: 1 to 64 ASCII letters, digits or `_ . + -`."""
    if not (isinstance(value, str) and _QOS_RE.fullmatch(value)):
        raise InvalidInput("--qos", shown(value), "use 1 to 64 letters, digits or _ . + -")


def check_args(args: tuple[str, ...]) -> None:
    if len(args) > MAX_ARGS:
        raise InvalidInput("arguments", f"{len(args)} arguments", f"more than {MAX_ARGS}")
    total = 0
    for arg in args:
        if not isinstance(arg, str):
            raise InvalidInput("argument", shown(arg), "must be text")
        if "\0" in arg:
            raise InvalidInput("argument", shown(arg), "contains a NUL byte")
        size = len(arg) + 1
        if not arg.isascii():
            try:
                size = len(arg.encode()) + 1
            except UnicodeEncodeError:
                raise InvalidInput("argument", shown(arg), "is not valid UTF-8 text") from None
        if size > MAX_ARG_STRLEN:
            raise InvalidInput("argument", shown(arg), "is longer than 128 KiB (Linux's limit)")
        total += size
    if total > MAX_ARGS_BYTES:
        raise InvalidInput(
            "arguments", f"{len(args)} arguments, {total} bytes", "more than 1 MiB in all"
        )


def check_env(env: dict[str, str]) -> None:
    """Names without `=` or NUL (exported shell functions such as `BASH_FUNC_x%%` are
    carried, as sbatch does), values without NUL, UTF-8, at most MAX_ENV_BYTES in all."""
    total = 0
    for key, value in env.items():
        if (
            not isinstance(key, str)
            or not isinstance(value, str)
            or not key
            or "=" in key
            or "\0" in key
            or "\0" in value
        ):
            raise InvalidInput("--env", shown(key), "not a valid environment variable")
        size = len(key) + len(value) + 2
        if not (key.isascii() and value.isascii()):
            try:
                size = len(key.encode()) + len(value.encode()) + 2
            except UnicodeEncodeError:
                raise InvalidInput("--env", shown(key), "is not valid UTF-8 text") from None
        if size > MAX_ARG_STRLEN:
            raise InvalidInput(
                "--env", shown(key), "K=V is longer than 128 KiB (Linux's limit for a variable)"
            )
        total += size
    if total > MAX_ENV_BYTES:
        raise InvalidInput(
            "--env",
            f"{len(env)} variables, {total} bytes",
            "the job's environment is larger than 1 MiB",
        )


def check_reason(text: object, field_name: str = "--reason") -> str:
    """A cancel, hold or drain reason: at most MAX_REASON bytes, no control characters."""
    check_text(field_name, text, MAX_REASON)
    assert isinstance(text, str)
    return text


def check_script(script: object, where: str) -> None:
    """A job's script: text of at most MAX_SCRIPT_BYTES bytes in UTF-8, without NUL (newlines
    and tabs are its business; it is never printed)."""
    if not isinstance(script, str):
        raise InvalidInput("script", shown(where), "must be text")
    size = len(script)
    if size <= MAX_SCRIPT_BYTES and not script.isascii():
        try:
            size = len(script.encode())
        except UnicodeEncodeError:
            raise InvalidInput("script", shown(where), "is not valid UTF-8 text") from None
    if size > MAX_SCRIPT_BYTES:
        raise InvalidInput("script", shown(where), "is larger than 4 MiB; is it really a script?")
    if "\0" in script:
        raise InvalidInput("script", shown(where), "contains a NUL byte")


def clean_line(text: str, limit: int) -> str:
    """Free text from a daemon (an agent's health reason, a job's end reason) as one bounded
    line that is safe to show: runs of whitespace (newlines too) become one space, any other
    control character U+FFFD. For text that must not be refused (an end report still counts)."""
    line = " ".join(text.split())
    if CONTROL_RE.search(line):
        line = CONTROL_RE.sub("\ufffd", line)
    return line[:limit]
