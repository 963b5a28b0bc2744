"""Run an assembled coordinator (gpuq.coordinator.server.assemble) behind its ports: the store
opened (and migrated), gRPC (grpc.aio) on a Unix socket and TCP, the handshake socket, the
HTTP endpoints (metrics, dashboard), and the chores.

The Unix socket and the handshake socket beside it (gpuq.coordinator.access.authority) sit in
GPUQ_HOME with mode 0666; the home is 0711 for a coordinator that serves every user (root's,
or one running as [coordinator] service_user: other users reach the sockets by name and nothing
else, every other file in it is private) and 0700 for anyone else's, which serves only its own
user. Every call says who makes it (gpuq.identity), checked
before its request is read. TCP binds to loopback unless configured otherwise. Locks come
first (gpuq.coordinator.locks): one coordinator per GPUQ_HOME and per store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from sqlalchemy.exc import DBAPIError

from gpuq import tls
from gpuq.config.settings import Settings
from gpuq.coordinator.access.authority import Authority, serve_handshake
from gpuq.coordinator.clock_chores import ClockChore, ClockChores
from gpuq.coordinator.front.grpc_agents import AgentLinkServicer
from gpuq.coordinator.front.grpc_queue import MAX_STREAMS_PER_USER, QueueServicer
from gpuq.coordinator.front.rpc_calls import AuthInterceptor, StreamCount
from gpuq.coordinator.listening import (
    UNIX_PATH_MAX,
    bind_tcp,
    check_listen,
    private_sqlite_file,
    remove_if_same,
)
from gpuq.coordinator.locks import ADDRESS_FILE, LOCK_CHECK, Locks, take_locks, watch_lock
from gpuq.coordinator.metrics import Metrics, MetricSources
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.limits import MAX_REQUEST_BYTES
from gpuq.errors import GpuqError
from gpuq.identity import create_key_file, serves_every_user
from gpuq.store.api import Store
from gpuq.store.engine import PgLock, storage_unavailable
from gpuq.v1 import agent_pb2_grpc, queue_pb2_grpc

if TYPE_CHECKING:
    from gpuq.web.http_endpoint import HttpEndpoint

log = logging.getLogger(__name__)
PERIODIC_PASS = 2.0  # seconds between passes when nothing happens (begin times, aging)
TERMINAL_SWEEP = 5.0  # seconds between looks for interactive jobs nobody attached to
HISTORY_PRUNE = 3600.0  # seconds between two prunes of the per-GPU history
MAX_STREAMS_PER_CONNECTION = 100  # calls at once on one client connection
GIL_SWITCH = 0.0005  # seconds (see start_coordinator)


@dataclass(slots=True)
class RunningCoordinator:
    coordinator: Coordinator
    server: grpc.aio.Server
    tcp_address: str | None
    unix_address: str
    locks: Locks | None = None
    socket_path: Path | None = None
    socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket this one made
    handshake: asyncio.AbstractServer | None = None
    # the HTTP endpoints ([coordinator] metrics_listen, web_listen), closed first on stop
    http: list[HttpEndpoint] = field(default_factory=list)  # imported only when one is on
    clock: ClockChores | None = None  # the periodic chores, once started

    async def stop(self, grace: float = 1.0) -> None:
        self.coordinator.chores.shutdown(wait=False)
        if self.clock is not None:
            await self.clock.stop()
        if self.handshake is not None:
            self.handshake.close()
        for endpoint in self.http:
            await endpoint.close()
        await self.server.stop(grace)
        await self.coordinator.close()
        self.coordinator.store.close()
        self.release()

    def release(self) -> None:
        """Remove the socket if it is still ours, then let go of the locks."""
        if self.socket_path is not None and self.socket_id is not None:
            remove_if_same(self.socket_path, self.socket_id)
            self.socket_id = None
        if self.locks is not None:
            self.locks.release()
            self.locks = None


async def start_coordinator(
    settings: Settings,
    on_fatal: Callable[[GpuqError], None] | None = None,
    stop: threading.Event | None = None,
) -> RunningCoordinator:
    """Everything up and listening; returns once clients can connect. `on_fatal` is called
    when the coordinator must stop on its own (it lost its store lock to another one). A
    standby ([coordinator] standby) returns only once it leads, or raises StandbyStopped
    when `stop` is set before."""
    # a thread doing pure-Python work (explaining a long queue) hands the GIL back to the
    # event loop within this long, not Python's default 5 ms: other calls wait for it no more
    sys.setswitchinterval(GIL_SWITCH)
    # TLS files and plaintext on a public address: said before anything is locked or opened
    tls.check_coordinator_tls(settings)
    if settings.coordinator.standby and settings.coordinator.listen:
        check_listen(settings.coordinator.listen)  # a wrong address is said now, not at takeover
    locks = await asyncio.to_thread(take_locks, settings, stop)
    try:
        return await _start(settings, locks, on_fatal)
    except BaseException:
        locks.release()
        raise


async def _start(
    settings: Settings, locks: Locks, on_fatal: Callable[[GpuqError], None] | None
) -> RunningCoordinator:
    key = create_key_file(settings.key_path).encode()
    cfg = settings.coordinator
    socket_path = settings.socket_path
    bound_path = socket_path.with_name(f".sock.{os.getpid()}")  # renamed into place once up
    for path in (socket_path, bound_path):
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            raise GpuqError(
                f"the socket path {path} is longer than {UNIX_PATH_MAX} bytes: "
                "choose a shorter GPUQ_HOME"
            )
    if cfg.listen:
        check_listen(cfg.listen)
    private_sqlite_file(settings)
    try:
        store = await asyncio.to_thread(
            Store.open, settings.database_url, sqlite_synchronous=cfg.sqlite_synchronous
        )
    except DBAPIError as exc:
        raise storage_unavailable(settings.database_url, exc) from None
    coordinator = assemble(store, cfg)
    authority = Authority(
        key,
        settings.nodes_dir,
        cfg.admin_group,
        coordinator.tokens.digests,
        serves_everyone=serves_every_user(cfg.service_user),
    )
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(authority)],
        # more calls at once are refused RESOURCE_EXHAUSTED, watch streams included
        maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
        options=[
            # the largest valid request, not more: nobody makes the coordinator hold 64 MiB
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.keepalive_time_ms", 20_000),
            # agents ping every 1 to 5 s (fence_time / 4: gpuq.agent.node_agent.KEEPALIVE_MIN/MAX)
            # to notice a silent cut; pings closer than this would get the connection closed
            ("grpc.http2.min_ping_interval_without_data_ms", 500),
            ("grpc.keepalive_permit_without_calls", 1),
            # never share a TCP port with another coordinator (grpc's default would, and the
            # kernel would then spread connections over both)
            ("grpc.so_reuseport", 0),
            # no bandwidth probe (a ping after data received): on an idle cluster every
            # heartbeat drew one, and its answer woke both daemons' gRPC threads again
            # (bench/idle_bench.py: 47 -> 30 wakeups/s). What clients and agents send here
            # is small; what they read is sized by their own windows
            ("grpc.http2.bdp_probe", 0),
        ],
    )
    chores = coordinator.chores
    running = RunningCoordinator(
        coordinator, server, None, f"unix:{socket_path}", locks, socket_path
    )
    try:
        try:
            await coordinator.start()
            await _serve(settings, running, authority, on_fatal)
        except DBAPIError as exc:
            raise storage_unavailable(settings.database_url, exc) from None
    except BaseException:
        running.locks = None  # start_coordinator releases them
        with contextlib.suppress(Exception):
            if chores.running:
                chores.shutdown(wait=False)
        if running.clock is not None:
            await running.clock.stop()
        for endpoint in running.http:
            with contextlib.suppress(Exception):
                await endpoint.close()
        with contextlib.suppress(Exception):
            await server.stop(0)
        with contextlib.suppress(Exception):
            await coordinator.close()
        store.close()
        running.release()  # the socket, if it was renamed into place already
        bound_path.unlink(missing_ok=True)
        raise
    return running


async def _serve(
    settings: Settings,
    running: RunningCoordinator,
    authority: Authority,
    on_fatal: Callable[[GpuqError], None] | None,
) -> None:
    cfg = settings.coordinator
    coordinator, server = running.coordinator, running.server
    chores = coordinator.chores
    streams = StreamCount(MAX_STREAMS_PER_USER)  # shared by Watch and the dashboard's events
    servicer = QueueServicer(
        coordinator.queries, coordinator.commands, coordinator.terminals, streams
    )
    queue_pb2_grpc.add_QueueServicer_to_server(servicer, server)
    agent_pb2_grpc.add_AgentLinkServicer_to_server(AgentLinkServicer(coordinator.link), server)
    socket_path = settings.socket_path
    bound_path = socket_path.with_name(f".sock.{os.getpid()}")
    bound_path.unlink(missing_ok=True)  # a leftover of an earlier process with this pid
    try:
        server.add_insecure_port(f"unix:{bound_path}")
    except RuntimeError:
        raise GpuqError(f"cannot create the socket {bound_path}") from None
    os.chmod(bound_path, 0o666)  # who calls is learnt per call (gpuq.identity), not from this
    tcp_address = agent_address = None
    if cfg.listen:
        # TLS when a certificate is configured; plaintext only on loopback or when the admin
        # said so (insecure_tcp): tokens cross this port
        credentials = tls.server_credentials(settings)
        tls.check_listen_security(cfg.listen, credentials is not None, cfg.insecure_tcp)
        tcp_address = bind_tcp(server, cfg.listen, credentials, "listen")
    if cfg.agent_listen:
        # agents only, mutual TLS: a node's certificate names it (gpuq.tls.peer_common_name)
        agent_credentials = tls.agent_server_credentials(settings)
        check_listen(cfg.agent_listen, "agent_listen")
        agent_address = bind_tcp(server, cfg.agent_listen, agent_credentials, "agent_listen")
    await server.start()
    running.handshake = await serve_handshake(authority, settings.auth_socket_path)
    # this coordinator holds the home's lock: a socket already there is a dead one's
    os.replace(bound_path, socket_path)
    made = socket_path.lstat()
    running.socket_id = (made.st_dev, made.st_ino)
    running.tcp_address = tcp_address
    unix_address = running.unix_address
    if running.locks is not None:
        await asyncio.to_thread(
            running.locks.update, unix=unix_address, tcp=tcp_address, agent=agent_address
        )
    await _start_http(settings, running, streams, authority)
    endpoints = {endpoint.name: endpoint.address for endpoint in running.http}
    (settings.home / ADDRESS_FILE).write_text(
        json.dumps(
            {
                "unix": unix_address,
                "tcp": tcp_address,
                "agent": agent_address,
                "pid": os.getpid(),
                **endpoints,
            }
        )
    )
    # one tick for all: the heartbeat check's (a quarter of the timeout, at most 2 s), or the
    # priority interval where an admin set it shorter
    tick = max(0.1, min(cfg.heartbeat_timeout / 4, 2.0, cfg.scheduler.priority_interval))
    periodic = [
        ClockChore(coordinator.node_admin.check_heartbeats, tick),
        ClockChore(coordinator.endings.check_time_limits, max(tick, 1.0)),
        # begin times arrive, priorities age: a pass now and then while jobs wait
        ClockChore(coordinator.periodic_wake, PERIODIC_PASS),
        # interactive jobs nobody attached to within the grace are cancelled
        ClockChore(coordinator.terminals.sweep, TERMINAL_SWEEP),
        # priorities move with age and fair share; begin times arrive: rank and schedule again
        ClockChore(coordinator.loop.rerank, cfg.scheduler.priority_interval),
        # per-GPU history past [coordinator] gpu_history_days goes
        ClockChore(coordinator.history.prune, HISTORY_PRUNE),
    ]
    locks = running.locks
    if locks is not None and isinstance(locks.store, PgLock):
        periodic.append(ClockChore(lambda: watch_lock(locks, settings, on_fatal), LOCK_CHECK))
    running.clock = ClockChores(tick, periodic)
    running.clock.start()
    chores.start()  # cron entries (gpuq.coordinator.cron_service): wall-clock times
    await coordinator.cron.start()
    log.info(
        "coordinator listening on %s%s%s",
        unix_address,
        f" and {tcp_address}{' (TLS)' if cfg.tls_cert else ''}" if tcp_address else "",
        f", agents on {agent_address} (mutual TLS)" if agent_address else "",
    )


async def _start_http(
    settings: Settings,
    running: RunningCoordinator,
    streams: StreamCount,
    authority: Authority,
) -> None:
    """The metrics and dashboard ports, where configured (their TLS rules were checked before
    the store opened: gpuq.tls.check_coordinator_tls)."""
    cfg = settings.coordinator
    if not (cfg.metrics_listen or cfg.web_listen):
        return
    # aiohttp is imported only where an HTTP port is on: its import costs about 0.2 s of
    # start-up and 9 MB a coordinator without these ports never needs
    from gpuq.web.dashboard import Dashboard
    from gpuq.web.http_endpoint import serve_http, server_ssl_context
    from gpuq.web.queue_access import QueueAccess

    context = server_ssl_context(settings)
    if cfg.metrics_listen:
        metrics = attach_metrics(running.coordinator)
        endpoint = await serve_http(cfg.metrics_listen, metrics.handle, context, name="metrics")
        running.http.append(endpoint)
    if cfg.web_listen:
        access = QueueAccess(running.coordinator, streams, authority)
        dashboard = Dashboard(access, cfg.web_url)
        endpoint = await serve_http(
            cfg.web_listen, dashboard.handle, context, name="web", owner_of=dashboard.session_user
        )
        running.http.append(endpoint)
        dashboard.address, dashboard.secure = endpoint.address, context is not None
        running.coordinator.commands.web_login = dashboard.login_link
        # where it is and how one gets in: else a new admin hunts for the port and the way in
        log.info(
            "web dashboard at %s: users sign in with the one-time link `gpuq web` prints "
            "(or a token from `gpuq admin token USER`)",
            dashboard.base_url(),
        )


def attach_metrics(co: Coordinator) -> Metrics:
    """Metrics of `co`, listening on its event bus (the last job-event listener: see
    assemble): every job event, every pass's and every commit's duration."""
    metrics = Metrics(metric_sources(co))
    co.bus.on_job_event(metrics.observe)
    co.bus.on_pass(metrics.pass_time.observe)
    co.bus.on_commit(metrics.write_time.observe)
    return metrics


def metric_sources(co: Coordinator) -> MetricSources:
    return MetricSources(
        settings=co.settings,
        jobs=co.jobs,
        nodes=co.nodes,
        inputs=co.inputs,
        arrays=co.arrays,
        idle=co.idle,
        notifier=co.notifier,
        clock=co.clock,
        explain=co.scheduling.explained,
    )
