"""Every NVML call the backend makes, guarded: an error is a value to handle, never a crash.

NVML reports trouble per call and per device, and a binding newer than the driver adds its own:
nvidia-ml-py 13 raises NVMLLibraryMismatchError (not an NVMLError) from an unversioned call whose
versioned function the driver lacks, NVMLError_FunctionNotFound from a versioned one, and an old
binding may lack a function or a keyword altogether. NvmlCalls turns all of them into CallError,
which names the call; Fallback walks a list of versions of one call and remembers the first that
works, so a driver is probed once, not on every heartbeat.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from gpuq.agent.gpu.nvml_health import describe_error, error_name

# Errors that mean the library, not a device, is in trouble: re-initialise NVML.
LIBRARY_ERRORS = frozenset(
    {"Uninitialized", "LibraryNotFound", "DriverNotLoaded", "LibRmVersionMismatch"}
)
# Errors that mean "this binding or driver lacks that version of the call": try the next one.
MISSING_ERRORS = frozenset(
    {"LibraryMismatch", "FunctionNotFound", "ArgumentVersionMismatch", "Missing", "TypeError"}
)


class CallError(Exception):
    """An NVML call failed; .call names it, .name is NVML's error name, .reason one line."""

    def __init__(self, call: str, error: BaseException, name: str | None = None) -> None:
        self.call = call
        self.error = error
        self.name = name or error_name(error)
        self.reason = describe_error(call, error)
        super().__init__(self.reason)

    @property
    def not_supported(self) -> bool:
        return self.name == "NotSupported"

    @property
    def missing(self) -> bool:
        """The binding or driver lacks this call (or version of it)."""
        return self.name in MISSING_ERRORS

    @property
    def library(self) -> bool:
        """The library itself is down: re-initialise rather than blame a device."""
        return self.name in LIBRARY_ERRORS


class NvmlCalls:
    """Calls into a pynvml-like library, turning every failure into CallError."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def call(self, function: str, *args: Any, label: str | None = None, **kwargs: Any) -> Any:
        """nvml.function(*args, **kwargs), or CallError naming label (default: function)."""
        name = label or function
        target = getattr(self.nvml, function, None)
        if target is None:
            raise CallError(name, AttributeError(f"the binding has no {function}"), "Missing")
        try:
            return target(*args, **kwargs)
        except TypeError as error:  # an old binding without this signature
            raise CallError(name, error, "TypeError") from error
        except Exception as error:  # NVMLError, NVMLLibraryMismatchError, ctypes or OS trouble
            raise CallError(name, error) from error

    def optional(self, function: str, *args: Any, default: Any = None, **kwargs: Any) -> Any:
        """A call for an optional feature: NotSupported or a missing call give `default`."""
        try:
            return self.call(function, *args, **kwargs)
        except CallError as failed:
            if failed.not_supported or failed.missing:
                return default
            raise


class Fallback:
    """Versions of one NVML call, newest first; the first that the driver has is remembered."""

    def __init__(self, functions: Sequence[str]) -> None:
        self.functions = tuple(functions)
        self._start = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        """The version in use (the newest not yet found missing)."""
        return self.functions[self._start]

    def call(self, calls: NvmlCalls, *args: Any) -> Any:
        """The result of the first version that exists; CallError from the last one tried."""
        index = self._start
        while True:
            try:
                result = calls.call(self.functions[index], *args)
            except CallError as failed:
                if failed.missing and index + 1 < len(self.functions):
                    index += 1
                    continue
                raise
            if index != self._start:
                with self._lock:
                    self._start = index
            return result

    def reset(self) -> None:
        """Probe from the newest again (after NVML was re-initialised, maybe a new driver)."""
        with self._lock:
            self._start = 0


def process_fallbacks() -> dict[str, Fallback]:
    """The process queries per kind, _v3 then _v2 then unversioned."""
    bases = {
        "compute": "nvmlDeviceGetComputeRunningProcesses",
        "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
        "mps": "nvmlDeviceGetMPSComputeRunningProcesses",
    }
    return {kind: Fallback([f"{base}_v3", f"{base}_v2", base]) for kind, base in bases.items()}


class MemoryQuery:
    """nvmlDeviceGetMemoryInfo v2 (used excludes driver-reserved memory), falling back to v1."""

    def __init__(self) -> None:
        self.v2 = True

    def used_and_total(self, calls: NvmlCalls, handle: Any) -> tuple[int, int]:
        version = getattr(calls.nvml, "nvmlMemory_v2", None)
        if self.v2 and version is not None:
            try:
                info = calls.call(
                    "nvmlDeviceGetMemoryInfo",
                    handle,
                    version=version,
                    label="nvmlDeviceGetMemoryInfo_v2",
                )
                return int(info.used), int(info.total)
            except CallError as failed:
                if not (failed.missing or failed.not_supported):
                    raise
                self.v2 = False  # a driver before R510: v1 counts reserved memory as used
        info = calls.call("nvmlDeviceGetMemoryInfo", handle)
        return int(info.used), int(info.total)
