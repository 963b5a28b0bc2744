"""Start a coordinator: store (migrated), gRPC (grpc.aio) on a Unix socket and TCP, chores.

The Unix socket sits in GPUQ_HOME (mode 0700) with mode 0600, so only the coordinator's user
reaches it; TCP binds to loopback unless configured otherwise; every call needs the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
from dataclasses import dataclass

import grpc
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpuq.auth import ensure_private_dir, ensure_token
from gpuq.config import Settings
from gpuq.coordinator.agents import AgentLink
from gpuq.coordinator.core import Coordinator
from gpuq.coordinator.cron import CronService
from gpuq.coordinator.passes import Passes
from gpuq.coordinator.servicers import AgentLinkServicer, QueueServicer, _Guard
from gpuq.errors import GpuqError
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2_grpc, queue_pb2_grpc

log = logging.getLogger(__name__)
ADDRESS_FILE = "coordinator.json"
PERIODIC_PASS = 2.0  # seconds between passes when nothing happens (begin times, aging)


@dataclass(slots=True)
class RunningCoordinator:
    coordinator: Coordinator
    link: AgentLink
    server: grpc.aio.Server
    chores: AsyncIOScheduler
    tcp_address: str | None
    unix_address: str

    async def stop(self, grace: float = 1.0) -> None:
        self.chores.shutdown(wait=False)
        await self.server.stop(grace)
        await self.coordinator.close()
        self.coordinator.store.close()


async def start_coordinator(settings: Settings) -> RunningCoordinator:
    """Everything up and listening; returns once clients can connect."""
    ensure_private_dir(settings.home)
    token = ensure_token(settings.token_path)
    cfg = settings.coordinator
    store = await asyncio.to_thread(
        Store.open, settings.database_url, sqlite_synchronous=cfg.sqlite_synchronous
    )
    user = pwd.getpwuid(os.geteuid()).pw_name
    coordinator = Coordinator(store, cfg, user)
    link = AgentLink(coordinator)
    passes = Passes(coordinator)
    await coordinator.start()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
    )
    guard = _Guard(token)
    chores = AsyncIOScheduler()
    cron = CronService(coordinator, chores)
    servicer = QueueServicer(coordinator, passes, cron, guard)
    queue_pb2_grpc.add_QueueServicer_to_server(servicer, server)
    agent_pb2_grpc.add_AgentLinkServicer_to_server(AgentLinkServicer(link, guard), server)
    with contextlib.suppress(FileNotFoundError):
        settings.socket_path.unlink()
    unix_address = f"unix:{settings.socket_path}"
    server.add_insecure_port(unix_address)
    tcp_address = None
    if cfg.listen:
        host = cfg.listen.rpartition(":")[0]
        try:
            bound = server.add_insecure_port(cfg.listen)
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise GpuqError(
                f"cannot listen on {cfg.listen} (in use?); set [coordinator] listen in the config"
            )
        tcp_address = f"{host}:{bound}"
    await server.start()
    os.chmod(settings.socket_path, 0o600)
    (settings.home / ADDRESS_FILE).write_text(
        json.dumps({"unix": unix_address, "tcp": tcp_address, "pid": os.getpid()})
    )
    tick = max(0.2, min(cfg.heartbeat_timeout / 4, 2.0))
    chores.add_job(link.check_heartbeats, "interval", seconds=tick, max_instances=1, coalesce=True)
    chores.add_job(
        link.check_time_limits, "interval", seconds=max(tick, 1.0), max_instances=1, coalesce=True
    )
    # priorities move with age and fair share; begin times arrive: rank and schedule again
    chores.add_job(
        passes.rerank,
        "interval",
        seconds=cfg.scheduler.priority_interval,
        max_instances=1,
        coalesce=True,
    )
    chores.add_job(
        coordinator.wake, "interval", seconds=PERIODIC_PASS, max_instances=1, coalesce=True
    )
    chores.start()
    await cron.start()
    log.info(
        "coordinator listening on %s%s", unix_address, f" and {tcp_address}" if tcp_address else ""
    )
    return RunningCoordinator(coordinator, link, server, chores, tcp_address, unix_address)
