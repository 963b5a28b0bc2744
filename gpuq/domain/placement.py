"""Where a job may run, and what a GPU is: the pure rules behind `--gpus a100:2`, `--nodelist`,
`--exclude` and `--constraint`.

GPU types are NVML's product names normalised to what people type: "NVIDIA A100-SXM4-80GB" is
"a100", "NVIDIA H100 80GB HBM3" is "h100", "NVIDIA RTX 6000 Ada Generation" is "rtx6000ada".
Node features are the labels an admin gives a node in `[agent] features`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuq.domain.limits import MAX_NODE_NAME, shown
from gpuq.errors import InvalidInput

MAX_PLACEMENT_NODES = 1024  # names in --nodelist or --exclude
MAX_CONSTRAINT = 1024  # characters of a --constraint expression
GPU_TYPE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
FEATURE_RE = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
NODE_NAME_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NODE_NAME}}}")


def check_gpu_type(value: object) -> str:
    """A GPU type as a user may write it: lower case letters, digits, `.`, `_`, `-`."""
    if not isinstance(value, str) or not GPU_TYPE_RE.fullmatch(value):
        raise InvalidInput(
            "--gpus",
            shown(value),
            "a GPU type is a model name such as a100, h100 or l40s (see gpuq nodes)",
        )
    return value


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


def _check_nodes(field_name: str, names: tuple[str, ...]) -> None:
    if not isinstance(names, tuple) or len(names) > MAX_PLACEMENT_NODES:
        raise InvalidInput(field_name, shown(names), f"at most {MAX_PLACEMENT_NODES} node names")
    for name in names:
        if not isinstance(name, str) or not NODE_NAME_RE.fullmatch(name):
            raise InvalidInput(field_name, shown(name), "not a node name")


@dataclass(frozen=True, slots=True)
class Placement:
    """sbatch's --nodelist, --exclude and --constraint; empty: anywhere."""

    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    constraint: str | None = None

    def __post_init__(self) -> None:
        _check_nodes("--nodelist", self.nodelist)
        _check_nodes("--exclude", self.exclude)
        if self.constraint is not None:
            check_feature_expression(self.constraint)

    def __bool__(self) -> bool:
        return bool(self.nodelist or self.exclude or self.constraint)


@dataclass(frozen=True, slots=True)
class Terminal:
    """An interactive job's pseudo-terminal, as the submitter's terminal is."""

    rows: int = 24
    cols: int = 80
    term: str = "xterm"
    stdin_tty: bool = True
    stdout_tty: bool = True

    def __post_init__(self) -> None:
        for name, value in (("rows", self.rows), ("cols", self.cols)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise InvalidInput("terminal", f"{name} {shown(value)}", "must be 0 to 65535")
        if not isinstance(self.term, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]{0,64}", self.term):
            raise InvalidInput("terminal", shown(self.term), "TERM is not a terminal name")
