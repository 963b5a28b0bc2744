"""The long-running verbs, each a daemon: serve (coordinator + local agent), coordinator, agent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gpuq.config.settings import Settings

log_option = click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)


def _agent_settings(settings: Any, **overrides: Any) -> Any:
    """Flags given on the command line win over the config file; they obey its rules."""
    from gpuq.config.value_checks import check_setting

    given = {
        key: check_setting("agent", key, value, "command line", "--" + key.replace("_", "-"))
        for key, value in overrides.items()
        if value is not None
    }
    return replace(settings, agent=replace(settings.agent, **given))


def agent_options(command: Any) -> Any:
    """The flags `gpuq serve` and `gpuq agent` share."""
    for decorator in reversed(
        [
            click.option("--fake-gpus", metavar="SPEC", help="pretend GPUs, e.g. 4 or 8xA100-80GB"),
            click.option("--node-name", help="this node's name (default: the host name)"),
            click.option(
                "--cpus",
                type=click.IntRange(1, 65536),
                help="CPUs offered to jobs (default: all)",
            ),
            click.option("--mem", metavar="SIZE", help="memory offered to jobs (default: all)"),
        ]
    ):
        command = decorator(command)
    return command


def _check_agent(agent: Any) -> None:
    """One clear error before anything starts."""
    if agent.fake_gpus is not None:
        from gpuq.agent.fake.gpu_backend import parse_fake_spec

        parse_fake_spec(agent.fake_gpus, agent.node_name)
    if agent.mem is not None:
        from gpuq.domain.units import parse_size

        parse_size(agent.mem, "--mem")


def _listen(listen: str) -> str | None:
    from gpuq.config.value_checks import check_setting

    checked: str | None = check_setting("coordinator", "listen", listen, "command line", "--listen")
    return checked


def http_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--web and --metrics: [coordinator] web_listen and metrics_listen from the command line."""
    command = click.option(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus /metrics here (loopback)"
    )(command)
    return click.option(
        "--web", metavar="HOST:PORT", help="serve the web dashboard here (gpuq web signs in)"
    )(command)


def _with_http(settings: Settings, web: str | None, metrics: str | None) -> Settings:
    from gpuq.config.value_checks import check_setting

    cfg = settings.coordinator
    if web is not None:
        cfg = replace(
            cfg, web_listen=check_setting("coordinator", "web_listen", web, "command line", "--web")
        )
    if metrics is not None:
        checked = check_setting(
            "coordinator", "metrics_listen", metrics, "command line", "--metrics"
        )
        cfg = replace(cfg, metrics_listen=checked)
    return replace(settings, coordinator=cfg)


@click.command()
@agent_options
@click.option("--listen", metavar="HOST:PORT", help="also listen on TCP (default: socket only)")
@http_options
@log_option
@click.pass_obj
def serve(
    obj: Any,
    /,
    listen: str | None,
    web: str | None,
    metrics: str | None,
    log_level: str,
    **agent: Any,
) -> None:
    """Run a coordinator and a local agent (state in GPUQ_HOME, SQLite). Ctrl-C stops them;
    running jobs keep running and are picked up at the next start."""
    from gpuq.daemons import run_serve, serve_settings, setup_logging

    settings = _with_http(_agent_settings(obj.settings(), **agent), web, metrics)
    _check_agent(settings.agent)
    setup_logging(log_level)
    run_serve(serve_settings(settings, _listen(listen) if listen is not None else None))


@click.command()
@click.option("--listen", metavar="HOST:PORT", help="TCP address (default 127.0.0.1:7817)")
@http_options
@click.option(
    "--standby",
    is_flag=True,
    default=None,
    help="PostgreSQL store: wait while another coordinator serves it, then take over",
)
@log_option
@click.pass_obj
def coordinator(
    obj: Any,
    /,
    listen: str | None,
    web: str | None,
    metrics: str | None,
    standby: bool | None,
    log_level: str,
) -> None:
    """Run the coordinator alone (a lab server runs it as gpuq-coordinator.service)."""
    from gpuq.daemons import run_coordinator, setup_logging

    settings = _with_http(obj.settings(), web, metrics)
    if listen is not None:
        settings = replace(
            settings, coordinator=replace(settings.coordinator, listen=_listen(listen))
        )
    if standby:
        settings = replace(settings, coordinator=replace(settings.coordinator, standby=True))
    setup_logging(log_level)
    run_coordinator(settings)


@click.command()
@click.option(
    "--coordinator",
    metavar="ADDR",
    help="unix:PATH or HOST:PORT, or several separated by commas, tried in order "
    "(default: this GPUQ_HOME's socket)",
)
@agent_options
@log_option
@click.pass_obj
def agent(obj: Any, /, log_level: str, **agent: Any) -> None:
    """Run a node agent (a lab server runs it as gpuq-agent.service)."""
    from gpuq.daemons import run_agent, setup_logging

    settings = _agent_settings(obj.settings(), **agent)
    _check_agent(settings.agent)
    setup_logging(log_level)
    run_agent(settings)
