"""Partitions, as SLURM users know them: named sets of nodes, each with its time limits,
who may use it and a default QOS, read from `[partitions.NAME]` in the config file.

Pure rules: which partitions a node is in, and what a submission to some partitions becomes
(`admit`): the partitions it names (or the default one), checked against the caller's groups
and the partitions' max_time, with the default time and QOS filled in. Without any partition
configured, `--partition` stays what it was before: a node feature
(gpuq.domain.node_constraints.with_partitions).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpuq.domain.node_constraints import FEATURE_RE, MAX_PARTITIONS, expand_nodes
from gpuq.domain.units import format_duration
from gpuq.errors import GpuqError, InvalidInput, PermissionDenied

PARTITION_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_GLOB_CHARS = frozenset("*?")


@dataclass(frozen=True, slots=True)
class Partition:
    """One `[partitions.NAME]` table. `nodes` are node names, SLURM host ranges (`gpu[01-04]`)
    or shell patterns (`gpu*`), as written; `allow_groups` empty: everyone."""

    name: str
    nodes: tuple[str, ...] = ()
    default_time: int | None = None  # seconds, for jobs without --time
    max_time: int | None = None  # seconds; longer --time is refused at submit
    allow_groups: tuple[str, ...] = ()
    qos: str | None = None  # the QOS of its jobs that name none
    default: bool = False  # jobs without --partition go here

    def has_node(self, node: str) -> bool:
        return any(node_matches(pattern, node) for pattern in self.nodes)


def node_matches(pattern: str, node: str) -> bool:
    """Does `node` match one `nodes` entry: a shell pattern when it has `*` or `?`, else a
    name or a SLURM host range (`gpu[01-04,07]`)."""
    if _GLOB_CHARS & set(pattern):
        return fnmatch.fnmatchcase(node, pattern)
    return node in expand_nodes(pattern, "nodes")


def check_node_pattern(pattern: str) -> str:
    """A `nodes` entry as the config may hold it (InvalidInput otherwise)."""
    if _GLOB_CHARS & set(pattern):
        if "[" in pattern or not re.fullmatch(r"[A-Za-z0-9_.*?-]{1,64}", pattern):
            raise InvalidInput(
                "nodes", pattern, "a pattern is letters, digits, _ . - with * and ? (no [...])"
            )
        return pattern
    expand_nodes(pattern, "nodes")
    return pattern


def default_partition(partitions: Mapping[str, Partition]) -> Partition | None:
    """The one partition marked `default = true` (as SLURM's Default=YES), if any."""
    return next((p for p in partitions.values() if p.default), None)


def default_in(partitions: Mapping[str, Partition], node: str) -> str:
    """The default partition's name when `node` is in it ("": not, or none is default), for
    the `*` sinfo puts after it."""
    chosen = default_partition(partitions)
    return chosen.name if chosen is not None and chosen.has_node(node) else ""


def node_partitions(partitions: Mapping[str, Partition], node: str) -> tuple[str, ...]:
    """The partitions `node` is in, in the config's order (sinfo's PARTITION column)."""
    return tuple(p.name for p in partitions.values() if p.has_node(node))


def parse_partitions(text: str) -> tuple[str, ...]:
    """`-p a,b` as names (any of them), in order, without repeats; InvalidInput otherwise.
    A name is also a node feature's spelling, so the same text serves a site without
    partitions."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise InvalidInput("--partition", text, "expected a partition name")
    if len(names) > MAX_PARTITIONS:
        raise InvalidInput("--partition", text, f"at most {MAX_PARTITIONS} partitions")
    for name in names:
        if not FEATURE_RE.fullmatch(name):
            raise InvalidInput(
                "--partition", text, "a partition name is letters, digits, _ . + or -"
            )
    return names


@dataclass(frozen=True, slots=True)
class Admitted:
    """What a submission becomes in partitions: where it may run, its time limit (the
    asked one, or the partitions' default_time) and its QOS (asked, or the partition's)."""

    partitions: tuple[str, ...]
    time_limit: int | None
    qos: str | None


def admit(
    partitions: Mapping[str, Partition],
    asked: tuple[str, ...],
    time_limit: int | None,
    qos: str | None,
    user: str,
    groups: Collection[str],
) -> Admitted:
    """A submission to `asked` (empty: the default partition, else anywhere) by `user` in
    `groups`. An unknown partition is refused with a line naming the partitions there are.
    Of the ones named, the job keeps those that admit it (the user is in its allow_groups,
    its --time within its max_time), as SLURM's EnforcePartLimits=ANY: `-p debug,gpu -t 3-0`
    runs in gpu alone; when none does, the first one's refusal is the answer. The first kept
    partition's default_time and qos apply where the job says none."""
    if not asked:
        chosen = default_partition(partitions)
        if chosen is None:
            return Admitted((), time_limit, qos)
        asked = (chosen.name,)
    for name in asked:
        if name not in partitions:
            line = f"no partition {name}; partitions: {', '.join(partitions)}"
            raise InvalidInput("--partition", name, "no such partition", line=line)
    refusals = {name: _refusal(partitions[name], time_limit, user, groups) for name in asked}
    found = [partitions[name] for name, refused in refusals.items() if refused is None]
    if not found:
        raise next(r for r in refusals.values() if r is not None)
    first = found[0]
    return Admitted(
        tuple(p.name for p in found),
        time_limit if time_limit is not None else first.default_time,
        qos if qos is not None else first.qos,
    )


def _refusal(
    partition: Partition, time_limit: int | None, user: str, groups: Collection[str]
) -> GpuqError | None:
    """Why `partition` will not take the job (None: it will): the user is not in its
    allow_groups, or its --time is over its max_time."""
    if partition.allow_groups and not set(partition.allow_groups) & set(groups):
        mine = ", ".join(sorted(groups)) or "no group"
        return PermissionDenied(
            f"partition {partition.name} is for groups {', '.join(partition.allow_groups)}: "
            f"{user} is in {mine}"
        )
    most = partition.max_time
    if most is not None and time_limit is not None and time_limit > most:
        asked, name = format_duration(time_limit), partition.name
        line = f"--time {asked} is over partition {name}'s max_time {format_duration(most)}"
        return InvalidInput("--time", asked, f"over partition {name}", line=line)
    return None
