"""`gpuq admin doctor`: what would make jobs fail or run unisolated on this machine, each with how
to fix it.

CHECKS is the one list of what doctor checks, in the order it prints them: each entry names a
function `(DoctorContext) -> list[Check]` as "module:function". A check module is imported only
when doctor runs, and one that cannot be imported, or a check that raises, becomes one "fail"
line naming the error while the others still run: a doctor that stops at the first surprise
would hide the rest of what it came to find.

Exit status (run_doctor's caller, gpuq.cli.doctor_verb): 1 when any check says "fail", else 0;
warnings do not change it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tomllib
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from gpuq.admin.checks import Check, DoctorContext, Status
from gpuq.config.loading import find_config_file, load_settings
from gpuq.config.settings import Settings, default_home
from gpuq.errors import GpuqError

CheckFunction = Callable[[DoctorContext], list[Check]]

# what doctor checks, in order: add a check module's function here, one line each
CHECKS: tuple[str, ...] = (
    "gpuq.admin.doctor_node:configuration_checks",
    "gpuq.admin.doctor_node:clock_checks",
    "gpuq.admin.doctor_reach:reachability_checks",
    "gpuq.admin.doctor_trust:certificate_checks",
    "gpuq.admin.doctor_trust:key_file_checks",
    "gpuq.admin.doctor_node:run_folder_checks",
    "gpuq.admin.doctor_gpus:gpu_checks",
    "gpuq.admin.doctor_cgroups:cgroup_checks",
)

WORDS: dict[Status, str] = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}
EXIT_CLEAN = 0  # no check failed (warnings allowed)
EXIT_PROBLEMS = 1  # at least one check failed: jobs would fail or run unisolated here
NAME_WIDTH = 20  # the names' column; a longer name pushes its own line's detail only


def run_checks(
    context: DoctorContext, checks: Iterable[str | CheckFunction] = CHECKS
) -> list[Check]:
    """Every check's findings, in order; a check that cannot be loaded or raises is one fail."""
    found: list[Check] = []
    for check in checks:
        found += _guarded(check, context)
    return found


def _guarded(check: str | CheckFunction, context: DoctorContext) -> list[Check]:
    name = check if isinstance(check, str) else getattr(check, "__name__", repr(check))
    try:
        function = _resolve(check)
        result = list(function(context))
        if not all(isinstance(item, Check) for item in result):
            raise TypeError(f"{name} returned something other than Checks")
        return result
    except Exception as error:  # a bug in a check must not hide the other checks' findings
        if os.environ.get("GPUQ_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        text = " ".join(str(error).split())[:300]
        return [
            Check(
                name.rpartition(":")[2].removesuffix("_checks").replace("_", " "),
                "fail",
                f"the check itself failed: {type(error).__name__}: {text}",
                "a bug in gpuq: report it with the output of GPUQ_DEBUG=1 gpuq admin doctor",
            )
        ]


def _resolve(check: str | CheckFunction) -> CheckFunction:
    if not isinstance(check, str):
        return check
    module, _, attribute = check.partition(":")
    function: CheckFunction = getattr(importlib.import_module(module), attribute)
    return function


def exit_status(checks: Sequence[Check]) -> int:
    return EXIT_PROBLEMS if any(check.status == "fail" for check in checks) else EXIT_CLEAN


# ---- the context: settings, or why they did not load ------------------------------------------


def doctor_context(
    config: Path | None = None, home: Path | None = None, root: Path | None = None
) -> DoctorContext:
    """The context doctor's checks read: the settings (the defaults when the config does not
    load, with the error kept for the configuration check), the config file, this machine's
    roles, and `root` in place of / for /proc, /sys, /dev and /run (a test's fake machine)."""
    error = ""
    try:
        settings = load_settings(config, home)
    except GpuqError as exc:
        settings = Settings(home=home or default_home())
        error = str(exc)
    try:
        file = find_config_file(config, settings.home)
    except GpuqError:
        file = None  # an explicit --config that does not exist: the error says so
    places = {}
    if root is not None:
        places = {name: root / name for name in ("proc", "sys", "dev", "run")}
    return DoctorContext(
        settings,
        config_file=file,
        config_error=error,
        roles=machine_roles(settings, _sections(file) if not error else frozenset()),
        **places,  # type: ignore[arg-type]
    )


def _sections(file: Path | None) -> frozenset[str]:
    if file is None:
        return frozenset()
    try:
        return frozenset(tomllib.loads(file.read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return frozenset()


def machine_roles(settings: Settings, sections: frozenset[str]) -> frozenset[str]:
    """What this machine is: a coordinator when its config has a [coordinator] section or its
    GPUQ_HOME a coordinator's key (one has run here); an agent when its config has an [agent]
    section or its GPUQ_HOME an agent's state. Neither: a client."""
    roles = set()
    if "coordinator" in sections or settings.key_path.exists():
        roles.add("coordinator")
    if "agent" in sections or (settings.home / "agent").is_dir():
        roles.add("agent")
    return frozenset(roles)


# ---- printing ---------------------------------------------------------------------------------


def render_text(checks: Sequence[Check]) -> str:
    """One entry per check: the status word and the name in columns, what was found, and on a
    warning or failure an indented line below it saying how to fix it."""
    from gpuq.cli.render import printable

    width = min(NAME_WIDTH, max((len(check.name) for check in checks), default=0))
    lines = []
    for check in checks:
        name = printable(check.name).ljust(width)
        lines.append(f"{WORDS[check.status]:<4}  {name}  {printable(check.detail)}")
        if check.fix and check.status in ("fail", "warn"):
            lines.append(f"{'':4}  {'':{width}}  fix: {printable(check.fix)}")
    return "\n".join(lines)


def render_json(checks: Sequence[Check]) -> str:
    """{"ok": no check failed, "checks": [{name, status, detail, fix}, ...]}, ASCII."""
    document = {
        "ok": exit_status(checks) == EXIT_CLEAN,
        "checks": [asdict(check) for check in checks],
    }
    return json.dumps(document, indent=2)
