"""The errors gpuq raises, shared by the core, the servers and the client.

Each error carries what a person needs to act on it; the servicers map them to gRPC status codes
in one place (gpuq.coordinator.front.rpc_calls), and say which error it was by its kind
(ERROR_KINDS, sent as the trailing metadata `gpuq-error`); the client maps them back, so a user
of the Python API and a user of the CLI see the same message and the same exception type.
"""

from __future__ import annotations


class GpuqError(Exception):
    """Base of every error gpuq raises on purpose."""


class InvalidInput(GpuqError):
    """A value a user gave is wrong; names the field and the value."""

    def __init__(self, field: str, value: object, problem: str, *, line: str | None = None) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        # `line`: the whole message, where "invalid FIELD VALUE: problem" would only repeat
        # the value ("no partition x; partitions: a, b")
        super().__init__(line or f"invalid {field} {value!r}: {problem}")


class Unsatisfiable(GpuqError):
    """A request no node of the cluster can ever satisfy (refused at submit)."""


class NotFound(GpuqError):
    """A job, node or other object that does not exist."""


class PermissionDenied(GpuqError):
    """The caller may not do this (another user's job, a bad token)."""


class IllegalTransition(GpuqError):
    """A job state change that the transition table does not allow."""

    def __init__(self, job_id: int, from_state: str, to_state: str) -> None:
        self.job_id = job_id
        self.from_state = from_state
        self.to_state = to_state
        super().__init__(f"job {job_id}: cannot go from {from_state} to {to_state}")


class DoubleBooking(GpuqError):
    """A GPU unit was about to be given to a second live allocation."""


class Conflict(GpuqError):
    """The request clashes with the current state (e.g. a node name already connected)."""


class ServerUnavailable(GpuqError):
    """The coordinator cannot be reached."""


class StorageUnavailable(GpuqError):
    """The job store cannot be used now (its database is unreachable, or busy): retry later."""


class StoreInUse(StorageUnavailable):
    """Another coordinator already serves this GPUQ_HOME or this database; names it."""


class ConfigError(InvalidInput):
    """A setting in the config file, the environment or on the command line is wrong: names
    where it came from, the key and the value."""

    def __init__(self, source: str, key: str, value: object, problem: str) -> None:
        self.source = source
        self.field = key
        self.value = value
        self.problem = problem
        GpuqError.__init__(self, f"{source}: {key} = {_shown(value)}: {problem}")


# an error's kind on the wire (trailing metadata ERROR_KIND_KEY, SubmitResult.error_kind): the
# exception type a client raises again. The most specific kind wins (StoreInUse is a
# StorageUnavailable, ConfigError an InvalidInput: both travel as their base's kind).
ERROR_KIND_KEY = "gpuq-error"
ERROR_KINDS: dict[str, type[GpuqError]] = {
    "invalid_input": InvalidInput,
    "unsatisfiable": Unsatisfiable,
    "not_found": NotFound,
    "permission_denied": PermissionDenied,
    "illegal_transition": IllegalTransition,
    "double_booking": DoubleBooking,
    "conflict": Conflict,
    "storage_unavailable": StorageUnavailable,
}


def error_kind(error: GpuqError) -> str:
    """The kind an error travels as ("" for one without a kind of its own)."""
    for cls in type(error).__mro__:
        for kind, known in ERROR_KINDS.items():
            if cls is known:
                return kind
    return ""


def _shown(value: object) -> str:
    """A value as it would be written in TOML (strings quoted, booleans lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        import json

        text = json.dumps(value if len(value) <= 200 else value[:200] + "...")
        return text
    if hasattr(value, "isoformat"):  # a TOML date or time
        return str(value.isoformat())
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, list):
        return "[...]"
    return repr(value)
