"""NVML's critical events (XIDs, double-bit ECC) for the agent's event thread.

One event set per NVML session: every physical GPU is registered for the critical types it
supports (nvmlDeviceGetSupportedEventTypes ∩ XID critical error | double-bit ECC; NotSupported
skips the GPU), and nvmlEventSetWait_v2 (else nvmlEventSetWait) waits with a timeout in slices
of at most a second, so that the backend can re-initialise NVML between two slices without
freeing a set someone is blocked on. The set is rebuilt when the backend's handles change.

Locks: the backend's lock is never taken while this module holds its own (the backend takes
them in the other order), so usage() and wait_events() on two threads cannot deadlock.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from gpuq.agent.gpu.backend import GpuEvent
from gpuq.agent.gpu.nvml_calls import CallError, Fallback, NvmlCalls
from gpuq.agent.gpu.nvml_health import DBE_XID, classify_xid
from gpuq.agent.gpu.nvml_inventory import text

log = logging.getLogger(__name__)

XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
DOUBLE_BIT_ECC = 0x2  # nvmlEventTypeDoubleBitEccError
WAIT_SLICE = 1.0  # seconds per NVML wait; bounds how long a re-init waits for this thread
RETRY_AFTER = 60.0  # seconds before retrying an event set NVML would not create
_DRAIN = 64  # events taken at once after the first
_NO_ID = 0xFFFFFFFF


def handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle: a real one's address, a fake one itself."""
    try:
        return ("address", ctypes.cast(handle, ctypes.c_void_p).value)
    except (TypeError, ctypes.ArgumentError):
        return ("object", handle)


def instance_id(value: Any) -> int | None:
    """A GPU/compute instance id from event data; None where NVML says "not a MIG instance"."""
    if value is None:
        return None
    number = int(value)
    return None if number == _NO_ID else number


class EventSource(Protocol):
    """What the watcher needs of its backend (gpu.nvml_backend.NvmlGpuBackend)."""

    def event_targets(self) -> tuple[int, bool, Any, dict[str, Any]]:
        """(handle generation, NVML running, its NvmlCalls, GPU uuid -> handle)."""
        ...

    def event_units(self, gpu_uuid: str, gi: int | None, ci: int | None) -> list[str]:
        """The allocatable units an event on that GPU (or MIG instance) concerns."""
        ...

    def mark_unhealthy(self, units: Iterable[str], reason: str) -> None: ...


class EventWatcher:
    """The event set of one backend; wait() runs on the agent's event thread."""

    def __init__(self, backend: EventSource) -> None:
        self._backend = backend
        self._lock = threading.Lock()  # held while inside NVML's event calls
        self._stop = threading.Event()
        self._set: Any = None
        self._calls: NvmlCalls | None = None
        self._generation = -1
        self._registered = 0
        self._retry_at = -math.inf
        self._keys: dict[Any, str] = {}  # handle_key -> GPU uuid
        self._wait_call = Fallback(["nvmlEventSetWait_v2", "nvmlEventSetWait"])

    def wait(self, timeout: float) -> list[GpuEvent]:
        """Events within timeout seconds, or [] at the deadline; never raises."""
        try:
            return self._wait(time.monotonic() + max(timeout, 0.0))
        except Exception:  # the event thread must live on whatever NVML does
            log.exception("waiting for NVML events")
            return []

    def reset(self) -> None:
        """Free the event set (before NVML shuts down); the next wait builds a new one."""
        with self._lock:
            self._free()

    def close(self) -> None:
        self._stop.set()
        # a fake library can end a wait in progress (a real one returns within WAIT_SLICE)
        interrupt = getattr(getattr(self._calls, "nvml", None), "gpuq_interrupt_waits", None)
        if interrupt is not None:
            interrupt()
        self.reset()

    def _wait(self, deadline: float) -> list[GpuEvent]:
        while not self._stop.is_set():
            generation, running, calls, gpus = self._backend.event_targets()
            with self._lock:
                stale = generation != self._generation or calls is not self._calls
                if running and stale and time.monotonic() >= self._retry_at:
                    self._build(calls, gpus, generation)
                usable = running and self._set is not None and self._registered > 0
                data: list[Any] | None = None
                if usable:
                    remaining = max(deadline - time.monotonic(), 0.0)
                    # rounded up: a wait that ends a fraction of a millisecond early would
                    # make another call (and a real driver another wakeup) for the rest
                    wait_ms = math.ceil(min(remaining, WAIT_SLICE) * 1000)
                    data = self._collect(calls, wait_ms)
            if data:
                return self._events(data, calls)
            if data is None:  # nothing to wait on, or NVML failed: sleep out the timeout
                self._stop.wait(max(deadline - time.monotonic(), 0.0))
                return []
            if time.monotonic() >= deadline:
                return []
        return []

    def _build(self, calls: NvmlCalls, gpus: dict[str, Any], generation: int) -> None:
        """A new event set with every GPU registered for the critical events it supports."""
        self._free()
        self._calls, self._generation = calls, generation
        try:
            self._set = calls.call("nvmlEventSetCreate")
        except CallError as failed:
            log.warning("no GPU events: %s", failed.reason)
            self._generation, self._retry_at = -1, time.monotonic() + RETRY_AFTER
            return
        self._retry_at = -math.inf
        nvml = calls.nvml
        wanted = int(getattr(nvml, "nvmlEventTypeXidCriticalError", XID_CRITICAL)) | int(
            getattr(nvml, "nvmlEventTypeDoubleBitEccError", DOUBLE_BIT_ECC)
        )
        for uuid, handle in gpus.items():
            self._keys[handle_key(handle)] = uuid
            try:
                supported = calls.optional("nvmlDeviceGetSupportedEventTypes", handle, default=0)
                types = int(supported) & wanted
                if types:
                    calls.call("nvmlDeviceRegisterEvents", handle, types, self._set)
                    self._registered += 1
            except CallError as failed:
                if not failed.not_supported:
                    log.warning("no events from GPU %s: %s", uuid, failed.reason)

    def _free(self) -> None:
        if self._set is not None and self._calls is not None:
            try:
                self._calls.call("nvmlEventSetFree", self._set)
            except CallError as failed:
                log.debug("freeing the event set: %s", failed.reason)
        self._set, self._registered, self._generation = None, 0, -1
        self._keys = {}

    def _collect(self, calls: NvmlCalls, timeout_ms: int) -> list[Any] | None:
        """The first event within timeout_ms and any already queued; [] on timeout; None if
        NVML failed (the set is rebuilt after RETRY_AFTER)."""
        found: list[Any] = []
        for wait_ms in [timeout_ms] + [0] * _DRAIN:
            try:
                found.append(self._wait_call.call(calls, self._set, wait_ms))
            except CallError as failed:
                if failed.name == "Timeout":
                    return found
                log.warning("waiting for GPU events: %s", failed.reason)
                self._free()
                self._retry_at = time.monotonic() + RETRY_AFTER
                return found or None
        return found

    def _events(self, data: list[Any], calls: NvmlCalls) -> list[GpuEvent]:
        """GpuEvents per unit; hardware XIDs make their units unhealthy at once."""
        events: list[GpuEvent] = []
        keys = self._keys
        for item in data:
            kind = int(getattr(item, "eventType", 0))
            if kind & XID_CRITICAL:
                xid = int(item.eventData)
            elif kind & DOUBLE_BIT_ECC:
                xid = DBE_XID
            else:
                continue
            gpu_uuid = keys.get(handle_key(item.device))
            if gpu_uuid is None:
                try:
                    gpu_uuid = text(calls.call("nvmlDeviceGetUUID", item.device))
                except CallError:
                    log.warning("XID %d on a GPU this agent does not know", xid)
                    continue
            gi = instance_id(getattr(item, "gpuInstanceId", None))
            ci = instance_id(getattr(item, "computeInstanceId", None))
            units = self._backend.event_units(gpu_uuid, gi, ci)
            hardware, description = classify_xid(xid)
            if hardware:
                self._backend.mark_unhealthy(units, description)
            events.extend(GpuEvent(unit, xid, hardware, description) for unit in units)
        return events
