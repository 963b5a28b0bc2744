"""Where a job may run: the pure rules behind `--nodelist`, `--exclude`, `--constraint` and
`--partition` (a node feature where no partition is configured; gpuq.domain.partitions), and
the Placement that holds them.

Node features are the labels an admin gives a node in `[agent] features`; a node also has the
types of its GPUs as features (gpuq.domain.gpu_types).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpuq.domain.limits import MAX_NODE_NAME, shown
from gpuq.errors import InvalidInput

MAX_PLACEMENT_NODES = 1024  # names in --nodelist or --exclude, ranges expanded
MAX_CONSTRAINT = 1024  # characters of a --constraint expression
MAX_NODE_FEATURES = 64  # labels in a node's [agent] features
MAX_PARTITIONS = 64  # partitions a job may name (-p a,b,...)
FEATURE_RE = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
NODE_NAME_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NODE_NAME}}}")


# ---- node features and --constraint --------------------------------------------------------


def check_feature_expression(value: object) -> str:
    """`a`, `a&b` (every one), `a|b` (any one), `a&b|c` (& binds tighter): node features."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CONSTRAINT:
        raise InvalidInput("--constraint", shown(value), "expected features such as a100&nvlink")
    for term in value.split("|"):
        for feature in term.split("&"):
            if not FEATURE_RE.fullmatch(feature):
                raise InvalidInput(
                    "--constraint",
                    shown(value),
                    "expected features (letters, digits, _ . + -) joined by & (all) or | (any)",
                )
    return value


def constraint_terms(expression: str) -> tuple[frozenset[str], ...]:
    """The expression as alternatives, each the features (lower case) a node needs all of."""
    return tuple(frozenset(f.lower() for f in term.split("&")) for term in expression.split("|"))


def constraint_matches(expression: str | None, features: Iterable[str]) -> bool:
    """Does a node with `features` satisfy `expression`? Features match without regard to
    case (`NVLink` is nvlink): labels are typed by hand on both sides."""
    if not expression:
        return True
    have = {f.lower() for f in features}
    return any(term <= have for term in constraint_terms(expression))


def with_partitions(constraint: str | None, partitions: str) -> str:
    """`--partition P[,Q]` as node features: the constraint and (any of) the partitions,
    written out with & and | (no parentheses in the grammar): `a|b` with `p` is `a&p|b&p`."""
    names = [p.strip() for p in partitions.split(",") if p.strip()]
    if not names:
        raise InvalidInput("--partition", shown(partitions), "expected a partition name")
    for name in names:
        if not FEATURE_RE.fullmatch(name):
            raise InvalidInput(
                "--partition",
                shown(partitions),
                "a partition is a node feature (letters, digits, _ . + -)",
            )
    terms = constraint.split("|") if constraint else [""]
    combined = "|".join(f"{t}&{p}" if t else p for t in terms for p in names)
    if len(combined) > MAX_CONSTRAINT:
        raise InvalidInput(
            "--partition", shown(partitions), "with --constraint, too long a constraint"
        )
    return combined


def check_node_features(values: object, where: str = "[agent] features") -> tuple[str, ...]:
    """A node's features as an admin lists them (or its agent registers them): at most
    MAX_NODE_FEATURES labels of FEATURE_RE, repeats dropped, in order."""
    if not isinstance(values, list | tuple) or len(values) > MAX_NODE_FEATURES:
        raise InvalidInput(
            where, shown(values), f"expected a list of at most {MAX_NODE_FEATURES} labels"
        )
    for value in values:
        if not isinstance(value, str) or not FEATURE_RE.fullmatch(value):
            raise InvalidInput(
                where, shown(value), "a feature is 1 to 64 letters, digits, '_', '.', '+' or '-'"
            )
    return tuple(dict.fromkeys(values))


# ---- node names: n1,n2 and n[1-4,7] ------------------------------------------------------------

_RANGE_RE = re.compile(r"\[([^\[\]]*)\]")


def expand_nodes(text: str, flag: str = "--nodelist") -> tuple[str, ...]:
    """`n1,n2`, `n[1-4,7]`, `gpu[01-16]` (widths kept, as SLURM writes them), several
    brackets (`r[1-2]n[1-3]`): the node names, in order, without repeats; at most
    MAX_PLACEMENT_NODES. A file name (SLURM reads `-w FILE` when it has a `/`) is refused."""
    if not isinstance(text, str):
        raise InvalidInput(flag, shown(text), "expected node names such as n1,n2 or n[1-4]")
    if "/" in text:
        raise InvalidInput(flag, shown(text), "node names, not a file: gpuq reads no node files")
    names: dict[str, None] = {}
    for item in _split_outside_brackets(text.strip(), flag):
        for name in _expand_one(item.strip(), flag):
            names[name] = None
            if len(names) > MAX_PLACEMENT_NODES:
                raise InvalidInput(flag, shown(text), f"more than {MAX_PLACEMENT_NODES} nodes")
    if not names:
        raise InvalidInput(flag, shown(text), "expected node names such as n1,n2 or n[1-4]")
    for name in names:
        if not NODE_NAME_RE.fullmatch(name):
            raise InvalidInput(flag, shown(name), "not a node name")
    return tuple(names)


def compress_nodes(names: Iterable[str]) -> str:
    """SLURM's compressed form of a node list, in the order given: `gpu[01-02,05]`, `a,b`.

    Consecutive names that differ only in a trailing number of the same width (or without
    leading zeros) fold into one bracket; expand_nodes reads the result back to the same
    names in the same order."""
    groups: list[tuple[str, list[str]]] = []  # (prefix, numbers as written), in order
    for name in names:
        match = _TRAILING_NUMBER_RE.fullmatch(name)
        if match is None:
            groups.append((name, []))
            continue
        prefix, number = match.group(1), match.group(2)
        if groups and groups[-1][0] == prefix and groups[-1][1]:
            groups[-1][1].append(number)
        else:
            groups.append((prefix, [number]))
    return ",".join(
        prefix if not numbers else _bracket(prefix, numbers) for prefix, numbers in groups
    )


_TRAILING_NUMBER_RE = re.compile(r"(.*?[^0-9])?([0-9]{1,9})")


def _bracket(prefix: str | None, numbers: list[str]) -> str:
    head = prefix or ""
    if len(numbers) == 1:
        return f"{head}{numbers[0]}"
    runs: list[list[str]] = []
    for number in numbers:
        last = runs[-1][-1] if runs else None
        if last is not None and int(number) == int(last) + 1 and _same_width(last, number):
            runs[-1].append(number)
        else:
            runs.append([number])
    parts = [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return f"{head}[{','.join(parts)}]"


def _same_width(a: str, b: str) -> bool:
    """`09`, `10` continue one range (zero-padded to one width); `9`, `10` too (no padding)."""
    padded = a.startswith("0") or b.startswith("0")
    return len(a) == len(b) if padded else True


def _split_outside_brackets(text: str, flag: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise InvalidInput(flag, shown(text), "brackets do not match")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise InvalidInput(flag, shown(text), "brackets do not match")
    items.append("".join(current))
    return [i for i in items if i.strip()]


def _expand_one(item: str, flag: str) -> list[str]:
    match = _RANGE_RE.search(item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    numbers: list[str] = []
    for part in match.group(1).split(","):
        low, dash, high = part.strip().partition("-")
        if not re.fullmatch(r"[0-9]{1,9}", low) or (dash and not re.fullmatch(r"[0-9]{1,9}", high)):
            raise InvalidInput(flag, shown(item), "expected a range such as n[1-4,7]")
        last = int(high) if dash else int(low)
        if last < int(low):
            raise InvalidInput(flag, shown(item), f"range {part} goes backwards")
        if last - int(low) >= MAX_PLACEMENT_NODES:
            raise InvalidInput(flag, shown(item), f"more than {MAX_PLACEMENT_NODES} nodes")
        width = len(low) if low.startswith("0") else 0
        numbers += [str(n).zfill(width) for n in range(int(low), last + 1)]
        if len(numbers) > MAX_PLACEMENT_NODES:
            raise InvalidInput(flag, shown(item), f"more than {MAX_PLACEMENT_NODES} nodes")
    rest = _expand_one(tail, flag)
    if len(numbers) * len(rest) > MAX_PLACEMENT_NODES:
        raise InvalidInput(flag, shown(item), f"more than {MAX_PLACEMENT_NODES} nodes")
    return [f"{head}{n}{r}" for n in numbers for r in rest]


def _check_nodes(field_name: str, names: tuple[str, ...]) -> None:
    if not isinstance(names, tuple) or len(names) > MAX_PLACEMENT_NODES:
        raise InvalidInput(field_name, shown(names), f"at most {MAX_PLACEMENT_NODES} node names")
    for name in names:
        if not isinstance(name, str) or not NODE_NAME_RE.fullmatch(name):
            raise InvalidInput(field_name, shown(name), "not a node name")


@dataclass(frozen=True, slots=True)
class Placement:
    """sbatch's --nodelist, --exclude and --constraint; empty: anywhere.

    `nodelist` is the nodes a job may run on (any one of them, or any `--nodes N` of them),
    not sbatch's "all of these must be in the allocation". `constraint` matches a node's
    features: its `[agent] features` and the types of its GPUs (a node with an A100 has the
    feature a100). `partitions` are the `[partitions.NAME]` it may run in (any one of them;
    the coordinator says which partitions a node is in); empty: any node."""

    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    constraint: str | None = None
    partitions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_nodes("--nodelist", self.nodelist)
        _check_nodes("--exclude", self.exclude)
        if self.constraint is not None:
            check_feature_expression(self.constraint)
        if not isinstance(self.partitions, tuple) or len(self.partitions) > MAX_PARTITIONS:
            raise InvalidInput("--partition", shown(self.partitions), "too many partitions")
        for name in self.partitions:
            if not isinstance(name, str) or not FEATURE_RE.fullmatch(name):
                raise InvalidInput("--partition", shown(name), "not a partition name")

    def __bool__(self) -> bool:
        return bool(self.nodelist or self.exclude or self.constraint or self.partitions)

    def node_problem(
        self, node: str, features: Iterable[str] | None, partitions: Iterable[str] = ()
    ) -> str | None:
        """Why this placement rules out node `node` with `features` (None: unknown yet, as
        for a node that has not registered since the coordinator started: it may match) in
        `partitions`, or None when it allows it."""
        if self.partitions and not set(self.partitions) & set(partitions):
            return f"node {node} is not in partition {','.join(self.partitions)}"
        if self.nodelist and node not in self.nodelist:
            return f"node {node} is not in --nodelist"
        if node in self.exclude:
            return f"node {node} is excluded (--exclude)"
        if (
            self.constraint
            and features is not None
            and not constraint_matches(self.constraint, features)
        ):
            return f"node {node} lacks features {self.constraint}"
        return None

    def describe(self) -> str:
        """ "nodelist n1,n2; exclude n3; constraint nvlink&ib" (how `gpuq show` prints it)."""
        parts = []
        if self.partitions:
            parts.append("partition " + ",".join(self.partitions))
        if self.nodelist:
            parts.append("nodelist " + ",".join(self.nodelist))
        if self.exclude:
            parts.append("exclude " + ",".join(self.exclude))
        if self.constraint:
            parts.append("constraint " + self.constraint)
        return "; ".join(parts)
