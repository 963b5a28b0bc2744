"""Read-only probes of the NVIDIA driver for bench/device_check.sh (issue 10, item 11).

    python3 bench/device_probe.py nvml                 # NVML discovery (ctypes; pynvml cross-check)
    python3 bench/device_probe.py cuda                 # what libcuda shows this process
    python3 bench/device_probe.py alloc [--gib 2] [--hold 8]   # hold VRAM, print the pid
    python3 bench/device_probe.py procs [--match-pid P]        # NVML's per-process VRAM
    python3 bench/device_probe.py forget --pid P [--since T]   # how long NVML lists a dead pid
    python3 bench/device_probe.py events               # XID event registration, 1 s wait

Standard library and ctypes only (pynvml is used for a cross-check when it can be imported),
so it runs with any python3 on a machine where gpuq itself could not be installed. Nothing here
changes the GPU: no MIG or compute mode change, no reset, no persistence mode. Where there is
no driver every mode prints "no driver: ..." and exits 0; only a probe that ran and failed
exits non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import glob
import os
import sys
import time
from collections.abc import Callable
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1

EVENT_TYPES = {
    0x1: "SingleBitEccError",
    0x2: "DoubleBitEccError",
    0x4: "PState",
    0x8: "XidCriticalError",
    0x10: "Clock",
    0x80: "PowerSourceChange",
    0x100: "MigConfigChange",
    0x200: "SingleBitEccErrorStorm",
    0x400: "DramRetirementEvent",
    0x800: "DramRetirementFailure",
    0x1000: "NonFatalPoisonError",
    0x2000: "FatalPoisonError",
    0x4000: "GpuUnavailableError",
    0x8000: "GpuRecoveryAction",
}
# what NVIDIA's k8s device plugin registers for health: XIDs and ECC errors
CRITICAL_EVENTS = 0x1 | 0x2 | 0x8
COMPUTE_MODES = {0: "Default", 1: "ExclusiveThread", 2: "Prohibited", 3: "ExclusiveProcess"}

GIB = 1 << 30
MIB = 1 << 20


class NoDriver(Exception):
    """The library is missing or the driver is not loaded: not a failure of the probe."""


def out(text: str = "") -> None:
    print(text, flush=True)


def mib(value: int) -> str:
    if value == NVML_VALUE_NOT_AVAILABLE:
        return "n/a"
    return f"{value / MIB:,.0f} MiB"


# ---------------------------------------------------------------- NVML over ctypes


class Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class PciInfo(ctypes.Structure):  # nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):  # the _v2 and _v3 calls fill the same layout
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class EventData(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


MEMORY_V2_VERSION = ctypes.sizeof(MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)


class NvmlError(Exception):
    def __init__(self, name: str, code: int, text: str) -> None:
        super().__init__(f"{name}: {text} ({code})")
        self.code = code


class Nvml:
    """The few NVML calls the probes need; every call raises NvmlError with NVML's text."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as exc:
            raise NoDriver(f"libnvidia-ml.so.1 cannot be loaded: {exc}") from exc
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        init = getattr(self.lib, "nvmlInit_v2", None) or self.lib.nvmlInit
        code = init()
        if code != NVML_SUCCESS:
            text = self.lib.nvmlErrorString(code).decode()
            raise NoDriver(f"nvmlInit: {text} ({code})")

    def has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def call(self, name: str, *args: Any) -> None:
        try:
            function = getattr(self.lib, name)
        except AttributeError:
            raise NvmlError(name, NVML_ERROR_FUNCTION_NOT_FOUND, "not in this driver") from None
        code = function(*args)
        if code != NVML_SUCCESS:
            raise NvmlError(name, code, self.lib.nvmlErrorString(code).decode())

    def text(self, name: str, *args: Any, size: int = 96) -> str:
        buffer = ctypes.create_string_buffer(size)
        self.call(name, *args, buffer, ctypes.c_uint(size))
        return buffer.value.decode("utf-8", "replace")

    def uint(self, name: str, *args: Any) -> int:
        value = ctypes.c_uint()
        self.call(name, *args, ctypes.byref(value))
        return value.value

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def processes(self, handle: ctypes.c_void_p, kind: str = "Compute") -> tuple[str, list[Any]]:
        """(binding used, processes) trying _v3, then _v2, then the unversioned call."""
        errors = []
        for suffix, struct in (("_v3", ProcessInfoV2), ("_v2", ProcessInfoV2), ("", ProcessInfoV1)):
            name = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
            if not self.has(name):
                errors.append(f"{name}: not in this driver")
                continue
            size = 64
            while True:
                count = ctypes.c_uint(size)
                array = (struct * size)()
                code = getattr(self.lib, name)(handle, ctypes.byref(count), array)
                if code == NVML_ERROR_INSUFFICIENT_SIZE and size < 4096:
                    size = max(size * 2, count.value + 8)
                    continue
                break
            if code == NVML_SUCCESS:
                return name, list(array[: count.value])
            errors.append(f"{name}: {self.lib.nvmlErrorString(code).decode()} ({code})")
        raise NvmlError(f"nvmlDeviceGet{kind}RunningProcesses*", -1, "; ".join(errors))


def attempt(label: str, function: Callable[[], object]) -> object:
    """Print `label: value`, or `label: error`; never raise (but NoDriver propagates)."""
    try:
        value = function()
    except NvmlError as exc:
        value = f"error: {exc}"
    except Exception as exc:
        value = f"error: {type(exc).__name__}: {exc}"
    out(f"  {label}: {value}")
    return value


def event_names(mask: int) -> str:
    names = [name for bit, name in EVENT_TYPES.items() if mask & bit]
    rest = mask & ~sum(EVENT_TYPES)
    if rest:
        names.append(hex(rest))
    return f"{mask:#x} ({', '.join(names) or 'none'})"


def nvml_memory(nvml: Nvml, handle: ctypes.c_void_p, indent: str) -> None:
    def v1() -> str:
        memory = Memory()
        nvml.call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        return f"total {mib(memory.total)}, used {mib(memory.used)}, free {mib(memory.free)}"

    def v2() -> str:
        memory = MemoryV2(version=MEMORY_V2_VERSION)
        nvml.call("nvmlDeviceGetMemoryInfo_v2", handle, ctypes.byref(memory))
        return (
            f"total {mib(memory.total)}, reserved {mib(memory.reserved)}, "
            f"used {mib(memory.used)}, free {mib(memory.free)}"
        )

    attempt(f"{indent}memory v1", v1)
    attempt(f"{indent}memory v2", v2)


def nvml_gpu(nvml: Nvml, index: int) -> None:
    handle = nvml.handle(index)
    out(f"GPU {index}")
    attempt("name", lambda: nvml.text("nvmlDeviceGetName", handle))
    attempt("uuid", lambda: nvml.text("nvmlDeviceGetUUID", handle))

    def pci() -> str:
        info = PciInfo()
        name = "nvmlDeviceGetPciInfo_v3" if nvml.has("nvmlDeviceGetPciInfo_v3") else ""
        nvml.call(name or "nvmlDeviceGetPciInfo_v2", handle, ctypes.byref(info))
        return f"{info.busId.decode()} (device id {info.pciDeviceId:#010x})"

    attempt("pci bus id", pci)
    attempt("minor number (/dev/nvidiaN)", lambda: nvml.uint("nvmlDeviceGetMinorNumber", handle))
    nvml_memory(nvml, handle, "")

    def mig_mode() -> str:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        nvml.call("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
        return f"current {current.value}, pending {pending.value} (1 = enabled)"

    mig = attempt("MIG mode", mig_mode)
    if isinstance(mig, str) and mig.startswith("current 1"):
        nvml_mig_devices(nvml, handle)

    def compute_mode() -> str:
        mode = ctypes.c_int()
        nvml.call("nvmlDeviceGetComputeMode", handle, ctypes.byref(mode))
        return COMPUTE_MODES.get(mode.value, str(mode.value))

    attempt("compute mode", compute_mode)

    def events() -> str:
        mask = ctypes.c_ulonglong()
        nvml.call("nvmlDeviceGetSupportedEventTypes", handle, ctypes.byref(mask))
        return event_names(mask.value)

    attempt("supported event types", events)

    def ecc() -> str:
        current, pending = ctypes.c_int(), ctypes.c_int()
        nvml.call("nvmlDeviceGetEccMode", handle, ctypes.byref(current), ctypes.byref(pending))
        return f"current {current.value}, pending {pending.value} (1 = enabled)"

    attempt("ECC mode", ecc)

    def volatile_uncorrected() -> int:
        count = ctypes.c_ulonglong()
        # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
        nvml.call("nvmlDeviceGetTotalEccErrors", handle, 1, 0, ctypes.byref(count))
        return count.value

    attempt("volatile uncorrected ECC errors", volatile_uncorrected)

    def remapped() -> str:
        values = [ctypes.c_uint() for _ in range(4)]
        nvml.call("nvmlDeviceGetRemappedRows", handle, *(ctypes.byref(v) for v in values))
        corr, unc, pending, failed = (v.value for v in values)
        return f"correctable {corr}, uncorrectable {unc}, pending {pending}, failure {failed}"

    attempt("remapped rows", remapped)

    def procs() -> str:
        binding, found = nvml.processes(handle)
        listed = ", ".join(f"pid {p.pid} {mib(p.usedGpuMemory)}" for p in found) or "none"
        return f"{listed} [{binding}]"

    attempt("compute processes", procs)


def nvml_mig_devices(nvml: Nvml, handle: ctypes.c_void_p) -> None:
    most = nvml.uint("nvmlDeviceGetMaxMigDeviceCount", handle)
    out(f"  MIG devices (at most {most}):")
    for slot in range(most):
        mig = ctypes.c_void_p()
        try:
            nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, ctypes.byref(mig))
        except NvmlError as exc:
            if exc.code != 6:  # NVML_ERROR_NOT_FOUND: an empty slot
                out(f"    slot {slot}: {exc}")
            continue
        out(f"    slot {slot}")
        attempt("    name (profile)", lambda m=mig: nvml.text("nvmlDeviceGetName", m))
        attempt("    uuid", lambda m=mig: nvml.text("nvmlDeviceGetUUID", m))
        attempt("    GPU instance", lambda m=mig: nvml.uint("nvmlDeviceGetGpuInstanceId", m))
        attempt(
            "    compute instance", lambda m=mig: nvml.uint("nvmlDeviceGetComputeInstanceId", m)
        )
        nvml_memory(nvml, mig, "    ")


def pynvml_crosscheck() -> None:
    """The same questions through nvidia-ml-py, which is what gpuq's agent uses."""
    out("pynvml (nvidia-ml-py) cross-check")
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError as exc:
        out(f"  not importable with {sys.executable}: {exc}")
        return
    out(f"  module {getattr(pynvml, '__file__', '?')}")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        out(f"  nvmlInit: {type(exc).__name__}: {exc}")
        return
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            attempt(f"GPU {index} memory v1 (used)", lambda h=handle: mib(_used(pynvml, h)))
            attempt(f"GPU {index} memory v2 (used)", lambda h=handle: mib(_used(pynvml, h, 2)))
            attempt(f"GPU {index} processes", lambda h=handle: _pynvml_procs(pynvml, h))
    finally:
        pynvml.nvmlShutdown()


def _used(pynvml: Any, handle: Any, version: int = 1) -> int:
    if version == 1:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)


def _pynvml_procs(pynvml: Any, handle: Any) -> str:
    found = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return ", ".join(f"pid {p.pid} {mib(int(p.usedGpuMemory or 0))}" for p in found) or "none"


def mode_nvml(args: argparse.Namespace) -> int:
    try:
        nvml = Nvml()
    except NoDriver as exc:
        out(f"no driver: {exc}")
        if not args.no_pynvml:
            pynvml_crosscheck()
        return 0
    attempt("driver version", lambda: nvml.text("nvmlSystemGetDriverVersion", size=80))
    attempt("NVML version", lambda: nvml.text("nvmlSystemGetNVMLVersion", size=80))

    def cuda_version() -> str:
        version = ctypes.c_int()
        name = "nvmlSystemGetCudaDriverVersion_v2"
        nvml.call(
            name if nvml.has(name) else "nvmlSystemGetCudaDriverVersion", ctypes.byref(version)
        )
        return f"{version.value // 1000}.{version.value % 1000 // 10}"

    attempt("CUDA driver version", cuda_version)
    count = nvml.uint("nvmlDeviceGetCount_v2")
    out(f"  GPUs: {count}")
    failed = 0
    for index in range(count):
        try:
            nvml_gpu(nvml, index)
        except NvmlError as exc:
            failed += 1
            out(f"GPU {index}: {exc}")
    if not args.no_pynvml:
        pynvml_crosscheck()
    return 1 if failed else 0


# ---------------------------------------------------------------- CUDA driver API over ctypes


class Cuda:
    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise NoDriver(f"libcuda.so.1 cannot be loaded: {exc}") from exc

    def error(self, code: int) -> str:
        name = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            self.lib.cuGetErrorName(code, ctypes.byref(name))
        return f"{(name.value or b'?').decode()} ({code})"

    def call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise RuntimeError(f"{name}: {self.error(code)}")


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_nodes() -> None:
    """Open each /dev/nvidiaN (what a device cgroup rule allows or denies)."""
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"), key=lambda p: (len(p), p))
    if not nodes:
        out("  /dev/nvidia[0-9]*: none")
    for path in nodes:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            out(f"  open {path}: errno {exc.errno} ({errno.errorcode.get(exc.errno, '?')})")
        else:
            os.close(fd)
            out(f"  open {path}: ok")
    for path in ("/dev/nvidiactl", "/dev/nvidia-uvm"):
        if os.path.exists(path):
            try:
                os.close(os.open(path, os.O_RDWR))
                out(f"  open {path}: ok")
            except OSError as exc:
                out(f"  open {path}: errno {exc.errno} ({errno.errorcode.get(exc.errno, '?')})")


def mode_cuda(args: argparse.Namespace) -> int:
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        out(f"  {name}={'<unset>' if value is None else repr(value)}")
    device_nodes()
    cuda = Cuda()
    started = time.monotonic()
    try:
        cuda.call("cuInit", 0)
    except RuntimeError as exc:
        out(f"  {exc} (after {time.monotonic() - started:.2f} s)")
        return 0  # a refused cuInit is an answer, not a failed probe
    out(f"  cuInit: ok ({time.monotonic() - started:.2f} s)")
    version = ctypes.c_int()
    cuda.call("cuDriverGetVersion", ctypes.byref(version))
    out(f"  cuDriverGetVersion: {version.value}")
    count = ctypes.c_int()
    cuda.call("cuDeviceGetCount", ctypes.byref(count))
    out(f"  cuDeviceGetCount: {count.value}")
    for ordinal in range(count.value):
        device = ctypes.c_int()
        cuda.call("cuDeviceGet", ctypes.byref(device), ordinal)
        name = ctypes.create_string_buffer(256)
        cuda.call("cuDeviceGetName", name, 256, device)
        raw = ctypes.create_string_buffer(16)
        uuid_call = "cuDeviceGetUuid_v2" if hasattr(cuda.lib, "cuDeviceGetUuid_v2") else ""
        cuda.call(uuid_call or "cuDeviceGetUuid", raw, device)
        total = ctypes.c_size_t()
        cuda.call("cuDeviceTotalMem_v2", ctypes.byref(total), device)
        bus = ctypes.create_string_buffer(64)
        cuda.call("cuDeviceGetPCIBusId", bus, 64, device)
        out(
            f"  device {ordinal}: {name.value.decode()} {uuid_text(raw.raw)} "
            f"bus {bus.value.decode()} total {mib(total.value)}"
        )
    return 0


def mode_alloc(args: argparse.Namespace) -> int:
    out(f"PID {os.getpid()}")
    out(f"  CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
    cuda = Cuda()
    cuda.call("cuInit", 0)
    device = ctypes.c_int()
    cuda.call("cuDeviceGet", ctypes.byref(device), 0)
    context = ctypes.c_void_p()
    try:
        cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        cuda.call("cuCtxSetCurrent", context)
        out("  context: primary (cuDevicePrimaryCtxRetain + cuCtxSetCurrent)")
    except RuntimeError as exc:
        out(f"  {exc}; trying cuCtxCreate_v2")
        cuda.call("cuCtxCreate_v2", ctypes.byref(context), 0, device)
        out("  context: cuCtxCreate_v2")
    size = int(args.gib * GIB)
    pointer = ctypes.c_uint64()
    cuda.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
    cuda.call("cuMemsetD8_v2", pointer, ctypes.c_ubyte(0x5A), ctypes.c_size_t(size))
    cuda.call("cuCtxSynchronize")
    out(f"ALLOCATED {size} bytes at {pointer.value:#x}; holding {args.hold:g} s")
    time.sleep(args.hold)
    cuda.call("cuMemFree_v2", pointer)
    out("  freed")
    return 0


def nvml_all_processes(nvml: Nvml) -> list[tuple[int, int, int, str]]:
    """(gpu index, pid, used bytes, binding) of every compute process on every GPU and slice."""
    found = []
    for index in range(nvml.uint("nvmlDeviceGetCount_v2")):
        handle = nvml.handle(index)
        handles = [handle]
        with contextlib.suppress(NvmlError):
            most = nvml.uint("nvmlDeviceGetMaxMigDeviceCount", handle)
            for slot in range(most):
                mig = ctypes.c_void_p()
                with contextlib.suppress(NvmlError):
                    nvml.call(
                        "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, ctypes.byref(mig)
                    )
                    handles.append(mig)
        for each in handles:
            try:
                binding, procs = nvml.processes(each)
            except NvmlError:
                continue  # a MIG parent answers NotSupported or the like
            found.extend((index, int(p.pid), int(p.usedGpuMemory), binding) for p in procs)
    return found


def mode_procs(args: argparse.Namespace) -> int:
    nvml = Nvml()
    found = nvml_all_processes(nvml)
    if not found:
        out("  NVML lists no compute process")
    for index, pid, used, binding in found:
        mark = "  <- the job" if pid == args.match_pid else ""
        out(f"  GPU {index}: pid {pid} used {mib(used)} [{binding}]{mark}")
    if args.match_pid:
        pids = {pid for _, pid, _, _ in found}
        if args.match_pid in pids:
            out(f"MATCH {args.match_pid}")
        else:
            big = [
                pid
                for _, pid, used, _ in found
                if used != NVML_VALUE_NOT_AVAILABLE and used >= args.min_bytes
            ]
            if len(big) == 1:
                out(f"  the job's pid {args.match_pid} is not listed; pid {big[0]} holds the")
                out("  allocation (NVML reports host-namespace pids)")
                out(f"MATCH {big[0]}")
            else:
                out(f"NOMATCH the job's pid {args.match_pid} is not listed by NVML")
    return 0


def mode_forget(args: argparse.Namespace) -> int:
    nvml = Nvml()
    since = args.since or time.time()
    exited_at: float | None = None
    deadline = time.monotonic() + args.timeout
    polls = 0
    while True:
        now = time.time()
        if exited_at is None and not os.path.exists(f"/proc/{args.pid}"):
            exited_at = now
        listed = any(pid == args.pid for _, pid, _, _ in nvml_all_processes(nvml))
        polls += 1
        if not listed:
            exit_note = (
                f"; the pid left /proc {exited_at - since:.3f} s after the cancel"
                if exited_at is not None
                else "; the pid is still in /proc (or another namespace)"
            )
            out(f"FORGOTTEN NVML stopped listing pid {args.pid} {now - since:.3f} s after the")
            out(f"  cancel ({polls} polls every {args.interval * 1000:.0f} ms{exit_note})")
            if exited_at is not None:
                out(f"  NVML lag behind the process exit: {now - exited_at:.3f} s")
            return 0
        if time.monotonic() > deadline:
            out(f"STILL LISTED pid {args.pid} after {now - since:.1f} s ({polls} polls)")
            return 1
        time.sleep(args.interval)


def mode_events(args: argparse.Namespace) -> int:
    nvml = Nvml()
    failed = 0
    for index in range(nvml.uint("nvmlDeviceGetCount_v2")):
        handle = nvml.handle(index)
        out(f"GPU {index}")
        mask = ctypes.c_ulonglong()
        try:
            nvml.call("nvmlDeviceGetSupportedEventTypes", handle, ctypes.byref(mask))
        except NvmlError as exc:
            out(f"  {exc}")
            failed += 1
            continue
        out(f"  supported: {event_names(mask.value)}")
        wanted = mask.value & CRITICAL_EVENTS
        out(f"  registering critical types: {event_names(wanted)}")
        event_set = ctypes.c_void_p()
        try:
            nvml.call("nvmlEventSetCreate", ctypes.byref(event_set))
            out("  nvmlEventSetCreate: ok")
        except NvmlError as exc:
            out(f"  {exc}")
            failed += 1
            continue
        try:
            try:
                nvml.call("nvmlDeviceRegisterEvents", handle, ctypes.c_ulonglong(wanted), event_set)
                out("  nvmlDeviceRegisterEvents: ok")
            except NvmlError as exc:
                out(f"  {exc}")
                failed += 1
                continue
            data = EventData()
            wait = "nvmlEventSetWait_v2" if nvml.has("nvmlEventSetWait_v2") else "nvmlEventSetWait"
            started = time.monotonic()
            try:
                nvml.call(wait, event_set, ctypes.byref(data), ctypes.c_uint(args.timeout_ms))
                out(
                    f"  {wait}: EVENT {event_names(data.eventType)} data {data.eventData} "
                    f"(GI {data.gpuInstanceId}, CI {data.computeInstanceId})"
                )
            except NvmlError as exc:
                took = time.monotonic() - started
                expected = " (expected: no event)" if exc.code == NVML_ERROR_TIMEOUT else ""
                out(f"  {exc} after {took:.2f} s{expected}")
                if exc.code != NVML_ERROR_TIMEOUT:
                    failed += 1
        finally:
            with contextlib.suppress(NvmlError):
                nvml.call("nvmlEventSetFree", event_set)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    nvml = modes.add_parser("nvml", help="NVML discovery")
    nvml.add_argument("--no-pynvml", action="store_true", help="skip the pynvml cross-check")
    modes.add_parser("cuda", help="what libcuda shows this process")
    alloc = modes.add_parser("alloc", help="hold VRAM with cuMemAlloc_v2")
    alloc.add_argument("--gib", type=float, default=2.0)
    alloc.add_argument("--hold", type=float, default=8.0)
    procs = modes.add_parser("procs", help="NVML's per-process VRAM")
    procs.add_argument("--match-pid", type=int, default=0)
    procs.add_argument("--min-bytes", type=int, default=GIB)
    forget = modes.add_parser("forget", help="time until NVML stops listing a pid")
    forget.add_argument("--pid", type=int, required=True)
    forget.add_argument("--since", type=float, default=0.0, help="epoch seconds of the kill")
    forget.add_argument("--interval", type=float, default=0.05)
    forget.add_argument("--timeout", type=float, default=30.0)
    events = modes.add_parser("events", help="XID event registration")
    events.add_argument("--timeout-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    run = {
        "nvml": mode_nvml,
        "cuda": mode_cuda,
        "alloc": mode_alloc,
        "procs": mode_procs,
        "forget": mode_forget,
        "events": mode_events,
    }[args.mode]
    try:
        return run(args)
    except NoDriver as exc:
        out(f"no driver: {exc}")
        return 0
    except (NvmlError, RuntimeError) as exc:
        out(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
