"""Reading the settings: defaults, then the config file, then GPUQ_* environment variables.

The config file is the first of `--config`, `$GPUQ_CONFIG`, `$GPUQ_HOME/config.toml`,
`/etc/gpuq/config.toml` that exists; every setting has a default, so none is needed. Each
section is checked key by key against gpuq.config.value_checks.RULES and built into its
dataclass (gpuq.config.settings; QOS tiers and the scheduler's policy: gpuq.domain.policy).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuq.config.settings import (
    AgentSettings,
    ClientSettings,
    CoordinatorSettings,
    Settings,
    default_home,
)
from gpuq.config.value_checks import RULES, TIER_NAME, check_home, check_setting, check_table
from gpuq.domain.partitions import PARTITION_NAME_RE, Partition, default_partition
from gpuq.domain.policy import FENCE_MARGIN, QosTier, SchedulerSettings, fence_wait
from gpuq.domain.units import format_duration
from gpuq.errors import ConfigError, InvalidInput

TOP_LEVEL = ("home", "coordinator", "agent", "client", "qos", "scheduler", "partitions")
# the sections' names for RULES (a [qos.NAME] section has the rules of "qos")
_SECTION_CLASSES: dict[type[Any], str] = {
    CoordinatorSettings: "coordinator",
    SchedulerSettings: "scheduler",
    QosTier: "qos",
    Partition: "partitions",
    AgentSettings: "agent",
    ClientSettings: "client",
}


def find_config_file(explicit: Path | None, home: Path) -> Path | None:
    candidates = [explicit] if explicit else []
    if env := os.environ.get("GPUQ_CONFIG"):
        candidates.append(Path(env))
    candidates += [home / "config.toml", Path("/etc/gpuq/config.toml")]
    for path in candidates:
        if path is not None and path.is_file():
            return path
    if explicit is not None:
        raise InvalidInput("--config", str(explicit), "no such file")
    return None


def load_settings(config: Path | None = None, home: Path | None = None) -> Settings:
    """Defaults, then the config file, then GPUQ_* environment variables. Every value is
    checked here, so a wrong one stops a command at once with one line naming it (ConfigError)
    instead of failing later, somewhere else."""
    base = Settings(home=home or default_home())
    path = find_config_file(config, base.home)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise InvalidInput("config", str(path), str(exc)) from exc
    source = f"config {path}"
    for key in data:
        if key not in TOP_LEVEL:
            raise ConfigError(source, key, data[key], _unknown("section", key, TOP_LEVEL))
    for name in ("coordinator", "agent", "client", "scheduler"):
        check_table(data.get(name, {}), source, f"[{name}]")
    settings = replace(
        base,
        home=check_home(data["home"], source) if "home" in data and home is None else base.home,
        coordinator=_coordinator_settings(
            data.get("coordinator", {}), data.get("qos"), data.get("scheduler", {}), source
        ),
        agent=_section(AgentSettings, data.get("agent", {}), "agent", source),
        client=_section(ClientSettings, data.get("client", {}), "client", source),
    )
    if "partitions" in data:
        coordinator = settings.coordinator
        partitions = _partitions(data["partitions"], coordinator.qos, source)
        settings = replace(settings, coordinator=replace(coordinator, partitions=partitions))
    _check_fence(settings, data, source)
    return _apply_env(settings)


def _partitions(raw: Any, tiers: dict[str, QosTier], source: str) -> dict[str, Partition]:
    """`[partitions.NAME]` tables: each checked key by key; a partition needs `nodes`, its QOS
    must be a tier, its default_time no longer than its max_time, and at most one is the
    default (as SLURM's Default=YES)."""
    partitions: dict[str, Partition] = {}
    for name, values in check_table(raw, source, "[partitions]").items():
        section = f"partitions.{name}"
        if not PARTITION_NAME_RE.fullmatch(name):
            raise ConfigError(
                source, f"[{section}]", values, "a partition name is letters, digits, _ . -"
            )
        check_table(values, source, f"[{section}]")
        if "nodes" not in values:
            raise ConfigError(source, f"[{section}] nodes", None, "missing: which nodes are in it")
        made: Partition = _section(Partition, values, section, source, name=name)
        if made.qos is not None and made.qos not in tiers:
            known = ", ".join(tiers) or "none"
            raise ConfigError(
                source, f"[{section}] qos", made.qos, f"no such qos tier (tiers: {known})"
            )
        if made.default and (other := default_partition(partitions)) is not None:
            raise ConfigError(
                source,
                f"[{section}] default",
                True,
                f"partition {other.name} is the default already: at most one may be",
            )
        partitions[name] = made
    return partitions


def _check_fence(settings: Settings, raw: dict[str, Any], source: str) -> None:
    """A file that sets the node timeout, the kill grace or an agent's fence_time must keep
    heartbeat_timeout at least fence_time + kill_grace (+ FENCE_MARGIN): the coordinator
    gives a silent node's jobs up no sooner than the fence has certainly stopped them, so a
    shorter timeout would only mislead (jobs would be requeued later than it says)."""
    coordinator, agent = raw.get("coordinator", {}), raw.get("agent", {})
    given = [
        (f"[{section}] {key}", values[key])
        for section, values, key in (
            ("coordinator", coordinator, "heartbeat_timeout"),
            ("agent", agent, "fence_time"),
            ("coordinator", coordinator, "kill_grace"),
        )
        if key in values
    ]
    if not given:
        return
    timeout = settings.coordinator.heartbeat_timeout
    fence, grace = settings.agent.fence_time, settings.coordinator.kill_grace
    needed = fence_wait(fence, grace)
    if timeout < needed:
        key, value = given[0]  # the one the file set, the node timeout first
        raise ConfigError(
            source,
            key,
            value,
            f"[coordinator] heartbeat_timeout ({timeout:g} s) must be at least [agent] "
            f"fence_time ({fence:g} s) + [coordinator] kill_grace ({grace:g} s) + "
            f"{FENCE_MARGIN:g} s = {needed:g} s: a silent node's jobs are given up only once "
            "its fence has stopped them",
        )


def _unknown(what: str, key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(sorted(known))}"
    return f"unknown {what}{hint}"


def _coordinator_settings(
    raw: dict[str, Any], qos: Any, scheduler: dict[str, Any], source: str
) -> CoordinatorSettings:
    raw = _folded_hide_job_names(raw, source)
    settings: CoordinatorSettings = _section(CoordinatorSettings, raw, "coordinator", source)
    settings = replace(
        settings, scheduler=_section(SchedulerSettings, scheduler, "scheduler", source)
    )
    if settings.heartbeat_timeout <= settings.heartbeat_interval:
        raise ConfigError(
            source,
            "[coordinator] heartbeat_timeout",
            raw.get("heartbeat_timeout", settings.heartbeat_timeout),
            f"must be longer than heartbeat_interval ({settings.heartbeat_interval:g} s)",
        )
    if qos is not None:
        tiers = {}
        for name, values in check_table(qos, source, "[qos]").items():
            if not TIER_NAME.fullmatch(name):
                raise ConfigError(source, f"[qos.{name}]", values, "not a usable tier name")
            check_table(values, source, f"[qos.{name}]")
            tiers[name] = _section(QosTier, values, f"qos.{name}", source, name=name)
        settings = replace(settings, qos=tiers)
    if settings.default_qos not in settings.qos:
        raise ConfigError(
            source,
            "[coordinator] default_qos",
            settings.default_qos,
            f"no such qos tier (tiers: {', '.join(settings.qos) or 'none'})",
        )
    return settings


def _folded_hide_job_names(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """`hide_job_names = true`, the setting private_data replaced, still works: it adds
    "names" to private_data (false adds nothing), so old config files keep their meaning."""
    if "hide_job_names" not in raw:
        return raw
    rest = {k: v for k, v in raw.items() if k != "hide_job_names"}
    if not check_setting("coordinator", "hide_job_names", raw["hide_job_names"], source):
        return rest
    private = rest.get("private_data", [])
    if isinstance(private, list) and "names" not in private:
        rest["private_data"] = [*private, "names"]
    return rest


def _section(cls: type[Any], raw: dict[str, Any], section: str, source: str, **extra: Any) -> Any:
    rules = RULES[_SECTION_CLASSES[cls]]
    values = dict(extra)
    for key, value in raw.items():
        if key not in rules:
            raise ConfigError(source, f"[{section}] {key}", value, _unknown("setting", key, rules))
        values[key] = rules[key](value, source, f"[{section}] {key}")
    made = cls(**values)
    if isinstance(made, QosTier | Partition):
        limit, default = made.max_time, made.default_time
        what = "tier" if isinstance(made, QosTier) else "partition"
        if limit is not None and default is not None and default > limit:
            raise ConfigError(
                source,
                f"[{section}] default_time",
                raw.get("default_time", default),
                f"longer than this {what}'s max_time ({format_duration(limit)})",
            )
    return made


def _apply_env(settings: Settings) -> Settings:
    coordinator, agent, client = settings.coordinator, settings.agent, settings.client
    if url := os.environ.get("GPUQ_DATABASE_URL"):
        url = check_setting("coordinator", "database_url", url, "environment", "GPUQ_DATABASE_URL")
        coordinator = replace(coordinator, database_url=url)
    if address := os.environ.get("GPUQ_COORDINATOR"):
        address = check_setting("agent", "coordinator", address, "environment", "GPUQ_COORDINATOR")
        agent = replace(agent, coordinator=address)
        client = replace(client, coordinator=address)  # for commands too (a job's own gpuq)
    return replace(settings, coordinator=coordinator, agent=agent, client=client)
