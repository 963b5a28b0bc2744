"""The rules: a type and a range for every setting, and the checks that apply them.

A wrong value stops a command at once with one line naming the file, the key and the value
(ConfigError), instead of failing later, somewhere else. `check_setting` applies the same rule
to a value that does not come from the file, such as a flag.
"""

from __future__ import annotations

import ipaddress
import math
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from gpuq.config.settings import ALLOCATOR_NAMES, DEFAULT_JOB_ENV, PRIVATE_DATA
from gpuq.domain.notify import check_mail_user, check_notify_url, parse_mail_types
from gpuq.domain.policy import DAY
from gpuq.errors import ConfigError, InvalidInput

YEAR = 365 * DAY
MAX_TIME_LIMIT = 366 * DAY  # as for --time
MAX_CPUS = 65536  # as for --cpus
MAX_MEM = 1 << 50  # 1 PiB: far beyond any machine, and well inside the wire's 64 bits
MAX_WEIGHT = 1e9
MAX_COUNT = 10_000_000
Check = Callable[[Any, str, str], Any]  # (value, source, key) -> the value, normalised

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_SHARED_GPUS = re.compile(r"|all|[A-Za-z0-9_.:-]{1,96}(,[A-Za-z0-9_.:-]{1,96}){0,1023}")
_GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
TIER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CGROUP_PART = re.compile(r"[A-Za-z0-9_.@:-]{1,100}")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
_DATABASE_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg")


def _kind(value: Any) -> str:
    """What TOML made of a value, in words."""
    kinds = {bool: "a boolean", str: "a string", int: "a whole number", float: "a number"}
    kinds |= {dict: "a table", list: "a list"}
    return kinds.get(type(value), "a date or time")


def _seconds(low: float, high: float) -> Check:
    return _number(low, high, "seconds")


def _number(low: float, high: float, unit: str = "") -> Check:
    def check(value: Any, source: str, key: str) -> float:
        what = f"a number{f' of {unit}' if unit else ''} from {low:g} to {high:g}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(source, key, value, f"expected {what}, not {_kind(value)}")
        if not math.isfinite(value) or not low <= value <= high:
            raise ConfigError(source, key, value, f"expected {what}")
        return float(value)

    return check


def _integer(low: int, high: int, unit: str = "") -> Check:
    def check(value: Any, source: str, key: str) -> int:
        what = f"a whole number{f' of {unit}' if unit else ''} from {low} to {high}"
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int):
            raise ConfigError(source, key, value, f"expected {what}, not {_kind(value)}")
        if not low <= number <= high:
            raise ConfigError(source, key, value, f"expected {what}")
        return number

    return check


def _boolean(value: Any, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, value, f"expected true or false, not {_kind(value)}")
    return value


def _choice(*options: str, upper: bool = False) -> Check:
    def check(value: Any, source: str, key: str) -> str:
        if isinstance(value, str) and (value.upper() if upper else value) in options:
            return value.upper() if upper else value
        _fail(source, key, value, f"expected one of {', '.join(options)}")

    return check


def _string(value: Any, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(source, key, value, f"expected a string, not {_kind(value)}")
    if "\0" in value:
        raise ConfigError(source, key, value, "contains a NUL character")
    return value


def _pattern(regex: re.Pattern[str], what: str) -> Check:
    def check(value: Any, source: str, key: str) -> str:
        if not regex.fullmatch(_string(value, source, key)):
            raise ConfigError(source, key, value, f"expected {what}")
        return str(value)

    return check


def _fail(source: str, key: str, value: Any, problem: str) -> NoReturn:
    if not isinstance(value, str):
        problem = f"{problem}, not {_kind(value)}"
    raise ConfigError(source, key, value, problem)


def _absolute_path(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    if not text or not Path(text).expanduser().is_absolute():
        raise ConfigError(source, key, value, "expected an absolute path")
    return text


def check_home(value: Any, source: str) -> Path:
    return Path(_absolute_path(value, source, "home")).expanduser()


def _host_port(value: str, source: str, key: str, *, any_port: bool) -> str:
    match = _HOST_PORT.fullmatch(value)
    low = 0 if any_port else 1
    if match is None or not low <= int(match.group(2)) <= 65535:
        raise ConfigError(source, key, value, f"expected HOST:PORT with a port from {low} to 65535")
    return value


def _listen(value: Any, source: str, key: str) -> str | None:
    """HOST:PORT (port 0: any free port), or "" for the Unix socket only."""
    text = _string(value, source, key)
    return _host_port(text, source, key, any_port=True) if text else None


MAX_ADDRESSES = 16  # a leader and its standbys


def _coordinator_address(value: Any, source: str, key: str) -> str:
    """unix:PATH or HOST:PORT, or several of them separated by commas (a leader and its
    standbys, tried in that order); normalised to no spaces around the commas."""
    text = _string(value, source, key)
    parts = [part.strip() for part in text.split(",")] if "," in text else [text]
    what = "expected unix:PATH or HOST:PORT, or several separated by commas"
    if len(parts) > MAX_ADDRESSES:
        raise ConfigError(source, key, value, f"{what} (at most {MAX_ADDRESSES})")
    for part in parts:
        if part.startswith("unix:"):
            if len(part) > len("unix:"):
                continue
            raise ConfigError(source, key, value, what)
        try:
            _host_port(part, source, key, any_port=False)
        except ConfigError:
            raise ConfigError(source, key, value, what) from None
    return ",".join(parts)


def redact_url(url: str) -> str:
    """A database URL fit to print: the password, if any, replaced by ***."""
    return re.sub(r"^([^:/]+://[^:/@]*):[^@]*@", r"\1:***@", url)


def _database_url(value: Any, source: str, key: str) -> str:
    """Only the shape here (the store checks the rest when it connects): the CLI must start
    fast, and a client command has no use for SQLAlchemy."""
    url = _string(value, source, key)
    scheme, sep, rest = url.partition("://")
    shown = redact_url(url)
    if not sep or scheme not in _DATABASE_SCHEMES:
        hint = (
            "; write postgresql:// (gpuq uses psycopg 3)" if scheme.startswith("postgres") else ""
        )
        raise ConfigError(
            source, key, shown, f"expected sqlite:///PATH or postgresql://USER@HOST/DATABASE{hint}"
        )
    if scheme.startswith("sqlite"):
        path = rest[1:].partition("?")[0] if rest.startswith("/") else ""
        if not path or path == ":memory:":
            raise ConfigError(
                source, key, shown, "expected sqlite:///PATH (an in-memory store loses the queue)"
            )
    elif not rest:
        raise ConfigError(source, key, shown, "expected postgresql://USER@HOST/DATABASE")
    return url


def _size(value: Any, source: str, key: str) -> str:
    from gpuq.domain.units import format_size, parse_size

    if not isinstance(value, str):
        raise ConfigError(
            source, key, value, f'expected a size such as "200G" (quoted), not {_kind(value)}'
        )
    try:
        size = parse_size(value, key)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    if size > MAX_MEM:
        raise ConfigError(source, key, value, f"expected at most {format_size(MAX_MEM)}")
    return value


def _output_limit(value: Any, source: str, key: str) -> int:
    """A job's output files' most bytes (max_output): a size such as "10G", in bytes."""
    from gpuq.domain.units import parse_size

    if not isinstance(value, str):
        raise ConfigError(
            source, key, value, f'expected a size such as "10G" (quoted), not {_kind(value)}'
        )
    try:
        return parse_size(value, key)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None


def _cgroup_parent(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    parts = text.strip("/").split("/")
    if len(text) > 255 or not all(
        _CGROUP_PART.fullmatch(p) and p not in {".", ".."} for p in parts
    ):
        raise ConfigError(
            source, key, value, "expected a cgroup path such as gpuq or system.slice/gpuq"
        )
    return text


def _fake_gpus(value: Any, source: str, key: str) -> str:
    """The shape only: `gpuq agent` and `gpuq serve` parse the spec before they start."""
    text = _string(value, source, key)
    if not text.strip() or len(text) > 1000:
        raise ConfigError(source, key, value, "expected a spec such as 4 or 8xA100-80GB")
    return text


def _job_env(value: Any, source: str, key: str) -> dict[str, str]:
    table = check_table(value, source, key)
    if len(table) > 256:
        raise ConfigError(source, key, value, "more than 256 variables")
    for name, text in table.items():
        where = f"[agent.job_env] {name}"
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(source, where, text, "not an environment variable name")
        if len(_string(text, source, where)) > 4096:
            raise ConfigError(source, where, text, "longer than 4096 characters")
    # merged over the defaults: an admin adds or changes one variable without restating the
    # rest; an empty value removes a default
    merged = {**DEFAULT_JOB_ENV, **table}
    # PyTorch's old and new names for the allocator settings are one setting
    given = [table[name] for name in ALLOCATOR_NAMES if name in table]
    for name in ALLOCATOR_NAMES:
        if given and name not in table:
            merged[name] = given[0]
    return {name: text for name, text in merged.items() if text != ""}


def _ip_address(value: Any, source: str, key: str) -> str:
    """An IP address (v4 or v6) other machines reach this one at."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(value if isinstance(value, str) else ""))
    except ValueError:
        raise ConfigError(source, key, value, "expected an IP address, e.g. 10.0.0.2") from None


def _features(value: Any, source: str, key: str) -> tuple[str, ...]:
    """A list of node features: labels of gpuq.domain.node_constraints' FEATURE_RE."""
    from gpuq.domain.node_constraints import check_node_features

    if not isinstance(value, list):
        raise ConfigError(
            source, key, value, f'expected a list such as ["nvlink", "ib"], not {_kind(value)}'
        )
    try:
        return check_node_features(value, key)
    except InvalidInput as exc:
        raise ConfigError(source, key, exc.value, exc.problem) from None


def _node_patterns(value: Any, source: str, key: str) -> tuple[str, ...]:
    """A partition's nodes: names, SLURM host ranges (gpu[01-04]) or shell patterns (gpu*)."""
    from gpuq.domain.partitions import check_node_pattern

    if not isinstance(value, list) or not value:
        raise ConfigError(
            source, key, value, 'expected a list such as ["gpu[01-04]", "big*"] (not empty)'
        )
    for item in value:
        if not isinstance(item, str):
            raise ConfigError(source, key, item, f"expected a node name, not {_kind(item)}")
        try:
            check_node_pattern(item)
        except InvalidInput as exc:
            raise ConfigError(source, key, item, exc.problem) from None
    return tuple(dict.fromkeys(value))


def _slurm_time(value: Any, source: str, key: str) -> int:
    """A SLURM time limit ("30", "1:00:00", "2-00:00:00"), in seconds, at most MAX_TIME_LIMIT."""
    from gpuq.domain.units import parse_duration

    if not isinstance(value, str):
        example = 'a time such as "1:00:00" or "7-00:00:00"'
        raise ConfigError(source, key, value, f"expected {example}, not {_kind(value)}")
    try:
        seconds = parse_duration(value, key)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    if seconds > MAX_TIME_LIMIT:
        raise ConfigError(source, key, value, "at most 366 days")
    return seconds


def _groups(value: Any, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, value, f'expected a list such as ["ml"], not {_kind(value)}')
    for item in value:
        if not isinstance(item, str) or not _GROUP_NAME.fullmatch(item):
            raise ConfigError(source, key, item, "expected a Unix group name")
    return tuple(dict.fromkeys(value))


def _web_url(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(source, key, value, "expected http(s)://HOST[:PORT][/PATH]")
    return text.rstrip("/")


def _mail_from(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    try:
        check_mail_user(text)
    except InvalidInput:
        raise ConfigError(source, key, value, "expected an address like gpuq@example.org") from None
    return text


def _networks(value: Any, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, value, 'expected a list of networks, e.g. ["10.0.0.0/8"]')
    found = []
    for item in value:
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except (TypeError, ValueError):
            raise ConfigError(source, key, item, "not a network (e.g. 10.0.0.0/8)") from None
    return tuple(found)


def _private_data(value: Any, source: str, key: str) -> tuple[str, ...]:
    options = ", ".join(f'"{o}"' for o in PRIVATE_DATA)
    if not isinstance(value, list):
        raise ConfigError(source, key, value, f"expected a list of {options} (or [])")
    for item in value:
        if item not in PRIVATE_DATA:
            raise ConfigError(source, key, item, f"expected {options}")
    return tuple(dict.fromkeys(value))


def _webhooks(value: Any, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, value, 'expected a list of URLs, e.g. ["https://..."]')
    found = []
    for item in value:
        try:
            check_notify_url(item)
        except InvalidInput as exc:
            raise ConfigError(source, key, item, str(exc)) from None
        found.append(item)
    return tuple(found)


def _notify_url(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    try:
        check_notify_url(text)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    return text


def _mail_type(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    try:
        parse_mail_types(text)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    return text


def check_table(value: Any, source: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(source, key, value, f"expected a table (a section), not {_kind(value)}")
    return value


RULES: dict[str, dict[str, Check]] = {
    "coordinator": {
        "database_url": _database_url,
        "listen": _listen,
        "sqlite_synchronous": _choice("OFF", "NORMAL", "FULL", "EXTRA", upper=True),
        "heartbeat_interval": _seconds(0.05, 3600),
        "heartbeat_timeout": _seconds(0.1, DAY),
        "kill_grace": _seconds(0, DAY),
        "store_write_timeout": _seconds(0.1, 3600),
        "max_queued_per_user": _integer(1, 100_000_000),
        "max_queued_bytes_per_user": _integer(1 << 20, 1 << 50, "bytes"),
        "list_page_size": _integer(1, 100_000),
        "default_qos": _pattern(TIER_NAME, "the name of a [qos.NAME] tier"),
        "standby": _boolean,
        "admin_group": _pattern(_GROUP_NAME, "a Unix group name"),
        "service_user": _pattern(_GROUP_NAME, "a Unix user name"),
        "allow_root_jobs": _boolean,
        "private_data": _private_data,
        "hide_job_names": _boolean,  # the old spelling of private_data = ["names"]
        "tls_cert": _absolute_path,
        "tls_key": _absolute_path,
        "tls_ca": _absolute_path,
        "agent_listen": _listen,
        "insecure_tcp": _boolean,
        "nodes_dir": _absolute_path,
        "max_concurrent_rpcs": _integer(8, 100_000),
        "metrics_listen": _listen,
        "web_listen": _listen,
        "web_url": _web_url,
        "gpu_history_days": _number(0.25, 3650, "days"),
        "mail_program": _absolute_path,
        "mail_from": _mail_from,
        "notify_allow": _networks,
        "notify_retries": _integer(0, 20),
        "admin_webhooks": _webhooks,
        "diagnosis_signatures": _absolute_path,
    },
    "scheduler": {
        "weight_age": _number(0, MAX_WEIGHT),
        "max_age": _seconds(1, 10 * YEAR),
        "weight_fairshare": _number(0, MAX_WEIGHT),
        "fairshare_half_life": _seconds(1, 10 * YEAR),
        "priority_interval": _seconds(0.1, DAY),
        "cancel_unsatisfiable": _boolean,
        "explain_limit": _integer(0, 1_000_000),
    },
    "qos": {
        "priority": _integer(-1_000_000, 1_000_000),
        "preemptible": _boolean,
        "max_running_gpus": _integer(0, MAX_COUNT),
        "max_running_jobs": _integer(0, MAX_COUNT),
        "max_submitted_jobs": _integer(0, MAX_COUNT),
        "default_time": _integer(1, MAX_TIME_LIMIT, "seconds"),
        "max_time": _integer(1, MAX_TIME_LIMIT, "seconds"),
        "requeue_on_node_fail": _integer(0, 1000),
        "idle_threshold": _number(0, 100, "percent"),
        "idle_window": _integer(1, MAX_TIME_LIMIT, "seconds"),
        "idle_action": _choice("flag", "cancel"),
        "hung_window": _integer(0, MAX_TIME_LIMIT, "seconds"),
        "max_output": _output_limit,
    },
    "partitions": {
        "nodes": _node_patterns,
        "default_time": _slurm_time,
        "max_time": _slurm_time,
        "allow_groups": _groups,
        "qos": _pattern(TIER_NAME, "the name of a [qos.NAME] tier"),
        "default": _boolean,
    },
    "agent": {
        "node_name": _pattern(
            _NODE_NAME, "a name of letters, digits, '.', '_' and '-' (at most 63)"
        ),
        "coordinator": _coordinator_address,
        "run_dir": _absolute_path,
        "fake_gpus": _fake_gpus,
        "cpus": _integer(1, MAX_CPUS),
        "mem": _size,
        "mem_enforcement": _choice("auto", "cgroup", "poll"),
        "cgroup_parent": _cgroup_parent,
        "job_max_pids": _integer(0, 1 << 22, "processes and threads"),
        "visible_devices": _choice("uuid", "index"),
        "job_env": _job_env,
        "fence_time": _seconds(0.1, DAY),
        "gpu_rescan": _seconds(1, DAY),
        "fabric_grace": _seconds(0, DAY),
        "handover_timeout": _seconds(0.1, 3600),
        "foreign_processes": _choice("report", "kill"),
        "sample_interval": _seconds(0.1, 3600),
        "shared_gpus": _pattern(_SHARED_GPUS, '"all", or GPU indices and UUIDs, comma-separated'),
        "allow_root_jobs": _boolean,
        "node_key": _absolute_path,
        "tls_ca": _absolute_path,
        "tls_cert": _absolute_path,
        "tls_key": _absolute_path,
        "features": _features,
        "address": _ip_address,
        "slurm_shims": _boolean,
        "job_coordinator": _coordinator_address,
        "max_output": _output_limit,
    },
    "client": {
        "coordinator": _coordinator_address,
        "tls_ca": _absolute_path,
        "token_file": _absolute_path,
        "notify_url": _notify_url,
        "mail_type": _mail_type,
    },
}


def check_setting(section: str, key: str, value: Any, source: str, label: str = "") -> Any:
    """`value` for `[section] key` checked and normalised, or ConfigError naming it (as `label`
    where given): for values that do not come from the config file, such as flags."""
    return RULES[section][key](value, source, label or f"[{section}] {key}")
