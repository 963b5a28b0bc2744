"""What agents send, bounded at the edge: a registration is checked field by field (refused
with InvalidInput naming the field), and heartbeats, samples and reports are cleaned instead
of refused (a heartbeat is never refused for its text or figures).

Everything here is shown to users (gpuq nodes, status, job listings), so text is one bounded
line without control characters.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Sequence

from gpuq.coordinator.workload.idle_rules import Sample, UnitReading
from gpuq.domain.limits import (
    CONTROL_RE,
    MAX_JOB_ID,
    MAX_NODE_TEXT,
    MAX_NODE_UNITS,
    MAX_TOPOLOGY_LINKS,
    MAX_UNIT_ID,
    check_range,
    check_text,
    clean_line,
    shown,
)
from gpuq.domain.node_constraints import check_node_features
from gpuq.domain.progress import Progress
from gpuq.errors import InvalidInput
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

MAX_END_REASON = 1000  # characters of an agent's reason for a job's end
MAX_NOTES = 16  # notes an agent may attach to one unit
# a node's name, as gpuq.config takes it ([agent] node_name)
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# a unit's UUID (GPU-..., MIG-..., the older MIG-GPU-.../1/0) or PCI bus id (00000000:17:00.0)
UNIT_ID_RE = re.compile(r"[A-Za-z0-9_.:/+-]{1,96}")


MAX_JOB_SAMPLES = 4096  # job samples of one heartbeat looked at


def sample_from_proto(message: apb.JobSample, gpus: Sequence[str], now: float) -> Sample:
    """A job's sample as the idle rules take it: one reading per unit the job holds (a unit
    the agent did not report on, or whose figure is not a number, is "unknown"); its time the
    agent's, or now where that is not a time."""
    given: dict[str, apb.UnitSample] = {u.uuid: u for u in message.units[:MAX_NODE_UNITS]}
    units: list[UnitReading] = []
    for uuid in gpus:
        unit = given.get(uuid)
        util: float | None = None
        if unit is not None and unit.HasField("util") and math.isfinite(unit.util):
            util = min(100.0, max(0.0, unit.util))
        units.append(UnitReading(uuid, util, unit.memory if unit is not None else 0))
    at = message.at if math.isfinite(message.at) and message.at > 0 else now
    return Sample(message.job_id, at, tuple(units), message.output_bytes)


MAX_PROGRESS_WORD = 40  # characters of a progress reading's unit, source or label
MAX_PROGRESS_COUNT = 1e18  # beyond any count a job prints (gpuq.domain.progress takes none)


def progress_from_proto(message: apb.JobProgress) -> Progress | None:
    """A job's progress reading as the coordinator keeps it: None when a count or rate is not
    a finite, non-negative number (or the total is 0); its words bounded single lines."""

    def count(value: float) -> bool:
        return math.isfinite(value) and 0.0 <= value < MAX_PROGRESS_COUNT

    total = message.total if message.HasField("total") else None
    rate = message.rate if message.HasField("rate") else None
    if not count(message.done) or (total is not None and (not count(total) or total <= 0)):
        return None
    if rate is not None and not count(rate):
        rate = None
    return Progress(
        done=message.done,
        total=total,
        rate=rate,
        unit=clean_line(message.unit, MAX_PROGRESS_WORD),
        source=clean_line(message.source, MAX_PROGRESS_WORD),
        label=clean_line(message.label, MAX_PROGRESS_WORD),
    )


def one_line(text: str) -> str:
    """An agent's free text as one bounded line."""
    return " ".join(text.split())[:MAX_NODE_TEXT]


def check_registration(message: apb.Register) -> None:
    """What an agent registers is bounded and holds no control characters (it is shown in
    gpuq nodes, status and job listings): InvalidInput naming the field otherwise."""
    if not NODE_NAME_RE.fullmatch(message.node):
        raise InvalidInput(
            "registration: node",
            shown(message.node),
            "use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    if message.address:
        check_node_address(message.address)
    check_range("registration: cpus", message.cpus, 0, MAX_NODE_CPUS)
    check_range("registration: mem", message.mem, 0, MAX_NODE_BYTES)
    if len(message.gpus) > MAX_NODE_UNITS:
        raise InvalidInput("registration: gpus", len(message.gpus), f"more than {MAX_NODE_UNITS}")
    for report in message.jobs:
        if not sane_report(report):
            raise InvalidInput(
                "registration: job", report.job_id, f"job ids go from 1 to {MAX_JOB_ID}"
            )
    for unit in message.gpus:
        _check_unit_id("registration: GPU uuid", unit.uuid)
        where = f"registration: GPU {brief_id(unit.uuid)}"
        check_range(f"{where} index", unit.index, 0, MAX_NODE_UNITS)
        check_range(f"{where} memory", unit.memory, 0, MAX_NODE_BYTES)
        check_text(f"{where} name", unit.name, MAX_NODE_TEXT)
        for field_name, value in (
            ("pci_bus_id", unit.pci_bus_id),
            ("parent_uuid", unit.parent_uuid),
            ("mig_profile", unit.mig_profile),
        ):
            if value:
                _check_unit_id(f"{where} {field_name}", value)
    check_node_features(list(message.features), "registration: features")
    if len(message.topology) > MAX_TOPOLOGY_LINKS:
        raise InvalidInput(
            "registration: topology", len(message.topology), f"more than {MAX_TOPOLOGY_LINKS} links"
        )
    for link in message.topology:
        _check_unit_id("registration: topology", link.a)
        _check_unit_id("registration: topology", link.b)
    for field_name, value in (
        ("driver", message.driver),
        ("isolation", message.isolation),
        ("gpu_problem", message.gpu_problem),
        ("version", message.version),
    ):
        # whitespace (a newline in an error text) is folded into spaces by _line; any other
        # control character (a terminal escape) is refused
        check_text(f"registration: {field_name}", one_line(value), MAX_NODE_TEXT)


MAX_NODE_CPUS = 1 << 20
MAX_NODE_BYTES = 1 << 60  # host memory or one GPU's: far beyond any machine, inside the store's
MAX_ATTEMPT = 2**31 - 1


def sane_report(report: apb.JobReport) -> bool:
    """A report whose numbers the store can hold (anything else names no job of ours)."""
    return 1 <= report.job_id <= MAX_JOB_ID and report.attempt <= MAX_ATTEMPT


def _check_unit_id(field_name: str, value: str) -> None:
    if not UNIT_ID_RE.fullmatch(value):
        raise InvalidInput(field_name, shown(value), "use 1 to 96 letters, digits or _ . : / + -")


def brief_id(value: str) -> str:
    """A unit id as an error may name it (printable, short)."""
    return CONTROL_RE.sub("?", value[:MAX_UNIT_ID])


def clean_usage(usage: Sequence[pb.GpuUsage]) -> tuple[pb.GpuUsage, ...]:
    """A heartbeat's units as shown in gpuq nodes: at most MAX_NODE_UNITS, each text one
    bounded line without control characters (a heartbeat is never refused for its text)."""
    kept: list[pb.GpuUsage] = []
    for unit in usage[:MAX_NODE_UNITS]:
        texts = (unit.uuid, unit.health, unit.health_reason, *unit.notes)
        if len(unit.notes) > MAX_NOTES or any(
            len(t) > MAX_NODE_TEXT or CONTROL_RE.search(t) for t in texts
        ):
            clean = pb.GpuUsage()
            clean.CopyFrom(unit)
            clean.uuid = clean_line(unit.uuid, MAX_UNIT_ID)
            clean.health = clean_line(unit.health, 32)
            clean.health_reason = clean_line(unit.health_reason, MAX_NODE_TEXT)
            clean.notes[:] = [clean_line(n, MAX_NODE_TEXT) for n in unit.notes[:MAX_NOTES]]
            unit = clean
        kept.append(unit)
    return tuple(kept)


def check_node_address(address: str) -> str:
    """An [agent] address: an IP address (jobs' MASTER_ADDR and the step workers' address)."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise InvalidInput(
            "registration: address", shown(address), "expected an IP address, e.g. 10.0.0.2"
        ) from None


def peer_address(peer: str) -> str:
    """The IP address in a gRPC peer ("ipv4:10.0.0.2:5000", "ipv6:[fe80::1]:5000"); for a
    Unix socket (an agent on the coordinator's machine) the loopback address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or LOOPBACK
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or LOOPBACK
    return LOOPBACK


LOOPBACK = "127.0.0.1"
