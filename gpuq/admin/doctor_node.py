"""Doctor's checks of the machine itself: its configuration and roles, its clock, and the
agent's run folder (gpuq.admin.doctor runs them)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from gpuq.admin.checks import Check, DoctorContext
from gpuq.errors import GpuqError

NOT_LOADED = "the configuration did not load (see its line)"

# ---- configuration and roles ------------------------------------------------------------------


def configuration_checks(context: DoctorContext) -> list[Check]:
    """The config file loads and every value is valid; which roles this machine has."""
    file = context.config_file
    if context.config_error:
        return [
            Check(
                "configuration",
                "fail",
                context.config_error,
                f'correct that setting in {file or "the config file"} (README "Configuration" '
                "lists every key and its range); every gpuq daemon refuses to start until then",
            )
        ]
    where = f"{file} loads" if file else "no config file: the defaults apply"
    return [
        Check("configuration", "ok", f"{where}; GPUQ_HOME {context.settings.home}"),
        _roles(context),
    ]


def _roles(context: DoctorContext) -> Check:
    roles = context.roles
    settings = context.settings
    if not roles:
        return Check(
            "role",
            "ok",
            "a client: no [coordinator] or [agent] section, and no coordinator or agent state "
            f"in {settings.home}",
        )
    parts = []
    if "coordinator" in roles:
        parts.append(f"coordinator (store {_store(settings.database_url)})")
    if "agent" in roles:
        gpus = f"fake GPUs {settings.agent.fake_gpus}" if settings.agent.fake_gpus else "NVML"
        parts.append(f"agent of node {settings.agent.node_name} ({gpus})")
    return Check("role", "ok", " and ".join(parts))


def _store(url: str) -> str:
    """The store's URL without its password."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if at and ":" in credentials:
        rest = f"{credentials.partition(':')[0]}:***@{host}"
    return f"{scheme}{sep}{rest}"


# ---- the clock ---------------------------------------------------------------------------------

STA_UNSYNC = 0x0040  # <linux/timex.h>: the clock is not synchronised
TIME_ERROR = 5  # adjtimex's answer when it is not
WHY_CLOCK = "job times, and certificates' and tokens' validity, depend on it"
CLOCK_FIX = (
    "run a time daemon: systemctl enable --now systemd-timesyncd (or chronyd), and check "
    "`timedatectl`"
)


class _Timex(ctypes.Structure):
    """struct timex (<sys/timex.h>), read with modes 0: nothing is changed."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long),
        ("time_usec", ctypes.c_long),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("padding", ctypes.c_int * 11),
    ]


def kernel_clock_synchronised() -> bool | None:
    """What the kernel says (adjtimex, read only): whether a time daemon (chrony, ntpd,
    systemd-timesyncd) keeps the clock synchronised; None when it cannot be asked. This is
    what `timedatectl` reports as "System clock synchronized"."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    return state != TIME_ERROR and not timex.status & STA_UNSYNC


def clock_checks(context: DoctorContext) -> list[Check]:
    """Is the clock synchronised? The kernel's word first; systemd-timesyncd's marker file
    where the kernel cannot be asked. Not synchronised, or unknown: a warning (a clock can be
    right without a daemon; doctor cannot tell how far off it is)."""
    return [clock_check(kernel_clock_synchronised(), context.run)]


def clock_check(kernel: bool | None, run: Path) -> Check:
    if kernel:
        return Check("clock", "ok", "synchronised (the kernel says so)")
    if kernel is False:
        return Check(
            "clock",
            "warn",
            f"not synchronised (the kernel says no time daemon keeps it): {WHY_CLOCK}",
            CLOCK_FIX,
        )
    if (run / "systemd" / "timesync" / "synchronized").exists():
        return Check("clock", "ok", "synchronised (systemd-timesyncd says so)")
    return Check(
        "clock",
        "warn",
        f"synchronised or not: unknown (adjtimex could not be asked): {WHY_CLOCK}",
        CLOCK_FIX,
    )


# ---- the agent's run folder ---------------------------------------------------------------------


def run_folder_checks(context: DoctorContext) -> list[Check]:
    """The folder the agent keeps job folders in is one only it controls (gpuq.agent.run_folder's
    rules, which the agent enforces at start): looked at, never made."""
    if context.config_error:
        return [Check("run folder", "skip", NOT_LOADED)]
    if "agent" not in context.roles:
        return [Check("run folder", "skip", "not an agent")]
    from gpuq.agent.run_folder import checked_run_dir, noexec, safe_folder
    from gpuq.run_root import TMPFS, recorded_root

    settings = context.settings
    if settings.agent.run_dir:
        configured = Path(settings.agent.run_dir).expanduser()
        if not configured.exists():
            return [Check("run folder", "ok", f"{configured} (made at the agent's start)")]
        try:
            real = checked_run_dir(configured)  # an existing folder is only looked at
        except GpuqError as error:
            return [_unsafe(str(error), configured)]
        if noexec(real):
            return [
                Check(
                    "run folder",
                    "fail",
                    f"{real} is mounted noexec: job scripts run from there",
                    "give [agent] run_dir a folder on a file system mounted without noexec",
                )
            ]
        return [Check("run folder", "ok", f"{real} ([agent] run_dir)")]
    if os.geteuid() != 0 or not TMPFS.is_dir() or noexec(TMPFS):
        return [Check("run folder", "ok", f"{settings.agent_state_dir} (not tmpfs)")]
    known = recorded_root(settings.agent_state_dir.parent)
    if known is None or not known.exists():
        return [Check("run folder", "ok", f"on {TMPFS} (made at the agent's start)")]
    if (problem := safe_folder(known)) is not None:
        return [
            Check(
                "run folder",
                "warn",
                f"{known} {problem}: the agent will not use it and makes another",
                f"find out who changed {known}; remove it once no job of this node runs",
            )
        ]
    return [Check("run folder", "ok", f"{known}")]


def _unsafe(problem: str, path: Path) -> Check:
    return Check(
        "run folder",
        "fail",
        f"{problem}: the agent refuses to start",
        f"make {path} root's (or the agent user's), mode 0700, below folders only root can write",
    )
