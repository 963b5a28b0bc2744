"""Start a coordinator: store (migrated), gRPC (grpc.aio) on a Unix socket and TCP, chores.

The Unix socket and the handshake socket beside it (gpuq.coordinator.authority) sit in GPUQ_HOME
with mode 0666; the home is 0711 for a root coordinator (other users reach the sockets by name
and nothing else: every other file in it is private) and 0700 for anyone else's, which serves
only its own user. Every call says who makes it (gpuq.identity), checked before its request
is read. TCP binds to loopback unless configured otherwise.

One coordinator per GPUQ_HOME and per store: before it binds or opens anything it takes an
flock on GPUQ_HOME/coordinator.lock, and a lock on the store (a PostgreSQL advisory lock, or an
flock beside an SQLite file outside GPUQ_HOME). A second coordinator is refused with the first
one's pid and addresses; a standby (`gpuq coordinator --standby`, PostgreSQL only) waits
instead, listening nowhere, until the store lock is free, then starts as any coordinator does.
The socket is bound under a private name and renamed into place, and removed at exit only if
it is still the file this coordinator made: grpc itself unlinks an existing socket when it
binds and unlinks its path when it stops, whoever's file is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy.exc import DBAPIError

from gpuq import tls
from gpuq.config import Settings, redact_url
from gpuq.coordinator.agents import AgentLink
from gpuq.coordinator.authority import AuthInterceptor, Authority, serve_handshake
from gpuq.coordinator.core import Coordinator
from gpuq.coordinator.cron import CronService
from gpuq.coordinator.metrics import Metrics
from gpuq.coordinator.passes import Passes
from gpuq.coordinator.servicers import AgentLinkServicer, QueueServicer, _Guard
from gpuq.domain.limits import MAX_REQUEST_BYTES
from gpuq.errors import GpuqError, StoreInUse
from gpuq.identity import create_key_file
from gpuq.store.api import Store
from gpuq.store.engine import FileLock, PgLock, parse_database_url, storage_unavailable
from gpuq.v1 import agent_pb2_grpc, queue_pb2_grpc
from gpuq.web.dashboard import Dashboard
from gpuq.web.http_endpoint import HttpEndpoint, serve_http, server_ssl_context
from gpuq.web.queue_access import QueueAccess

log = logging.getLogger(__name__)
ADDRESS_FILE = "coordinator.json"
LOCK_FILE = "coordinator.lock"
PERIODIC_PASS = 2.0  # seconds between passes when nothing happens (begin times, aging)
LOCK_CHECK = 5.0  # seconds between checks that a PostgreSQL lock is still held
UNIX_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less the NUL
STANDBY_POLL = 1.0  # seconds between a standby's tries for the store lock
MAX_STREAMS_PER_CONNECTION = 100  # calls at once on one client connection


class StandbyStopped(Exception):
    """A standby was told to stop before it took over."""


@dataclass(slots=True)
class Locks:
    """This coordinator's claim on its home and its store, and what it tells others."""

    info: dict[str, Any]
    home: FileLock
    store: FileLock | PgLock | None = None

    def update(self, **info: Any) -> None:
        self.info.update(info)
        for lock in (self.home, self.store):
            if lock is not None:
                lock.update(self.info)

    def release(self) -> None:
        if self.store is not None:
            self.store.release()
            self.store = None
        self.home.release()


@dataclass(slots=True)
class RunningCoordinator:
    coordinator: Coordinator
    link: AgentLink
    server: grpc.aio.Server
    chores: AsyncIOScheduler
    tcp_address: str | None
    unix_address: str
    locks: Locks | None = None
    socket_path: Path | None = None
    socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket this one made
    handshake: asyncio.AbstractServer | None = None
    # the HTTP endpoints ([coordinator] metrics_listen, web_listen), closed first on stop
    http: list[HttpEndpoint] = field(default_factory=list)

    async def stop(self, grace: float = 1.0) -> None:
        self.chores.shutdown(wait=False)
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


def remove_if_same(path: Path, ident: tuple[int, int]) -> None:
    """Unlink `path` only if it is still the file `ident` names (never another's socket)."""
    with contextlib.suppress(OSError):
        info = path.lstat()
        if (info.st_dev, info.st_ino) == ident:
            path.unlink()


def prepare_home(home: Path) -> None:
    """GPUQ_HOME, made: 0711 for root (other users reach its sockets by name, nothing else),
    0700 otherwise."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o711 if os.geteuid() == 0 else 0o700)


def take_locks(settings: Settings, stop: threading.Event | None = None) -> Locks:
    """The home lock, then the store lock (StoreInUse naming the holder when taken). Blocking:
    a PostgreSQL store is connected to here (StorageUnavailable when it cannot be). A standby
    waits for the store lock instead of being refused; StandbyStopped when `stop` is set
    first."""
    standby = settings.coordinator.standby
    prepare_home(settings.home)
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "unix": f"unix:{settings.socket_path}",
        "tcp": settings.coordinator.listen,
        "store": redact_url(settings.database_url),
    }
    url = settings.database_url
    parsed = parse_database_url(url)  # a bad URL fails before anything is locked
    postgres = parsed.get_backend_name() == "postgresql"
    if standby and not postgres:
        raise GpuqError(
            "a standby coordinator needs a PostgreSQL store ([coordinator] database_url = "
            "postgresql://...); on SQLite only one coordinator can serve the queue"
        )
    home = FileLock.acquire(settings.home / LOCK_FILE, f"GPUQ_HOME {settings.home}", info)
    locks = Locks(info, home)
    try:
        if postgres and standby:
            # this home's lock is ours: an address file here is a dead coordinator's
            (settings.home / ADDRESS_FILE).unlink(missing_ok=True)
            locks.store = PgLock.wait(
                url,
                info,
                stop or threading.Event(),
                lambda line: log.info("standing by: %s; taking over when it stops", line),
                poll=STANDBY_POLL,
            )
            if locks.store is None:
                raise StandbyStopped
            log.info("took the store lock: this standby is now the coordinator")
        elif postgres:
            locks.store = PgLock.acquire(url, info)
        elif settings.coordinator.database_url is not None and parsed.database:
            # an SQLite file outside this home: other homes may name it too
            database = Path(parsed.database).absolute()
            database.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            locks.store = FileLock.acquire(
                database.with_name(database.name + ".lock"), f"the SQLite store {database}", info
            )
    except BaseException:
        locks.release()
        raise
    return locks


async def start_coordinator(
    settings: Settings,
    on_fatal: Callable[[GpuqError], None] | None = None,
    stop: threading.Event | None = None,
) -> RunningCoordinator:
    """Everything up and listening; returns once clients can connect. `on_fatal` is called
    when the coordinator must stop on its own (it lost its store lock to another one). A
    standby ([coordinator] standby) returns only once it leads, or raises StandbyStopped
    when `stop` is set before."""
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
    _private_sqlite_file(settings)
    try:
        store = await asyncio.to_thread(
            Store.open, settings.database_url, sqlite_synchronous=cfg.sqlite_synchronous
        )
    except DBAPIError as exc:
        raise storage_unavailable(settings.database_url, exc) from None
    coordinator = Coordinator(store, cfg)
    link = AgentLink(coordinator)
    passes = Passes(coordinator)
    authority = Authority(key, settings.nodes_dir, cfg.admin_group, coordinator.tokens)
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(authority)],
        # more calls at once are refused RESOURCE_EXHAUSTED, watch streams included
        maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
        options=[
            # the largest valid request, not more: nobody makes the coordinator hold 64 MiB
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.keepalive_time_ms", 20_000),
            # agents ping every 1 to 5 s (fence_time / 4: gpuq.agent.agent.KEEPALIVE_MIN/MAX)
            # to notice a silent cut; pings closer than this would get the connection closed
            ("grpc.http2.min_ping_interval_without_data_ms", 500),
            ("grpc.keepalive_permit_without_calls", 1),
            # never share a TCP port with another coordinator (grpc's default would, and the
            # kernel would then spread connections over both)
            ("grpc.so_reuseport", 0),
        ],
    )
    chores = AsyncIOScheduler()
    running = RunningCoordinator(
        coordinator, link, server, chores, None, f"unix:{socket_path}", locks, socket_path
    )
    try:
        try:
            await coordinator.start()
            await _serve(settings, running, passes, authority, on_fatal)
        except DBAPIError as exc:
            raise storage_unavailable(settings.database_url, exc) from None
    except BaseException:
        running.locks = None  # start_coordinator releases them
        with contextlib.suppress(Exception):
            if chores.running:
                chores.shutdown(wait=False)
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
    passes: Passes,
    authority: Authority,
    on_fatal: Callable[[GpuqError], None] | None,
) -> None:
    cfg = settings.coordinator
    coordinator, link, server, chores = (
        running.coordinator,
        running.link,
        running.server,
        running.chores,
    )
    guard = _Guard(authority)
    cron = CronService(coordinator, chores)
    servicer = QueueServicer(coordinator, passes, cron, guard)
    queue_pb2_grpc.add_QueueServicer_to_server(servicer, server)
    agent_pb2_grpc.add_AgentLinkServicer_to_server(AgentLinkServicer(link, guard), server)
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
        tcp_address = _bind_tcp(server, cfg.listen, credentials, "listen")
    if cfg.agent_listen:
        # agents only, mutual TLS: a node's certificate names it (gpuq.tls.peer_common_name)
        agent_credentials = tls.agent_server_credentials(settings)
        check_listen(cfg.agent_listen, "agent_listen")
        agent_address = _bind_tcp(server, cfg.agent_listen, agent_credentials, "agent_listen")
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
    await _start_http(settings, running, servicer, authority, passes)
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
    # interactive jobs nobody attached to within the grace are cancelled
    chores.add_job(
        coordinator.terminals.sweep, "interval", seconds=5.0, max_instances=1, coalesce=True
    )
    if running.locks is not None and isinstance(running.locks.store, PgLock):
        chores.add_job(
            _watch_lock,
            "interval",
            seconds=LOCK_CHECK,
            args=(running, settings, on_fatal),
            max_instances=1,
            coalesce=True,
        )
    chores.start()
    await cron.start()
    log.info(
        "coordinator listening on %s%s%s",
        unix_address,
        f" and {tcp_address}{' (TLS)' if cfg.tls_cert else ''}" if tcp_address else "",
        f", agents on {agent_address} (mutual TLS)" if agent_address else "",
    )


async def _start_http(
    settings: Settings,
    running: RunningCoordinator,
    servicer: QueueServicer,
    authority: Authority,
    passes: Passes,
) -> None:
    """The metrics and dashboard ports, where configured (their TLS rules were checked before
    the store opened: gpuq.tls.check_coordinator_tls)."""
    cfg = settings.coordinator
    context = server_ssl_context(settings)
    if cfg.metrics_listen:
        metrics = Metrics(running.coordinator, passes.explained)
        metrics.install()
        endpoint = await serve_http(cfg.metrics_listen, metrics.handle, context, name="metrics")
        running.http.append(endpoint)
    if cfg.web_listen:
        dashboard = Dashboard(QueueAccess(servicer, authority), cfg.web_url)
        endpoint = await serve_http(cfg.web_listen, dashboard.handle, context, name="web")
        running.http.append(endpoint)
        dashboard.address, dashboard.secure = endpoint.address, context is not None
        servicer.web_login = dashboard.login_link


def _private_sqlite_file(settings: Settings) -> None:
    """The default SQLite store, created 0600 before SQLite makes it with the umask's mode (its
    -wal and -shm files take the database file's): it holds every job's script and environment."""
    if settings.coordinator.database_url is not None:
        return
    path = settings.home / "gpuq.db"
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    for name in ("gpuq.db", "gpuq.db-wal", "gpuq.db-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(settings.home / name, 0o600)


def _bind_tcp(
    server: grpc.aio.Server,
    address: str,
    credentials: grpc.ServerCredentials | None,
    setting: str,
) -> str:
    """Bind `address` (TLS with `credentials`, else plaintext); HOST:PORT as bound."""
    host = address.rpartition(":")[0]
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise GpuqError(
            f"cannot listen on {address} (in use?); set [coordinator] {setting} in the config"
        )
    return f"{host}:{bound}"


def check_listen(listen: str, setting: str = "listen") -> None:
    """One clear error, before grpc tries (and logs lines of its own), when the TCP address
    is in use or is not an address of this machine."""
    host, _, port_text = listen.rpartition(":")
    port = int(port_text)
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise GpuqError(f"cannot listen on {listen}: {exc.strerror}") from None
    problems: list[OSError] = []
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                problems.append(exc)
    in_use = [p for p in problems if p.errno == errno.EADDRINUSE]
    if in_use or len(problems) == len(found):
        problem = (in_use or problems)[0].strerror
        where = f"[coordinator] {setting} in the config"
        if setting == "listen":
            where += " (or --listen)"
        raise GpuqError(f"cannot listen on {listen}: {problem}; set {where}")


async def _watch_lock(
    running: RunningCoordinator,
    settings: Settings,
    on_fatal: Callable[[GpuqError], None] | None,
) -> None:
    """A PostgreSQL lock lives as long as its session: when the connection was lost (the
    server restarted, the network broke), take the lock again, or stop if another coordinator
    took it meanwhile (two coordinators must never share a store)."""
    locks = running.locks
    if locks is None or not isinstance(locks.store, PgLock):
        return
    if await asyncio.to_thread(locks.store.holds):
        return
    log.warning("the connection that holds the store lock was lost; taking the lock again")
    try:
        fresh = await asyncio.to_thread(PgLock.acquire, settings.database_url, locks.info)
    except StoreInUse as exc:
        log.error("lost the store lock to another session, so this coordinator stops: %s", exc)
        if on_fatal is not None:
            on_fatal(exc)
        return
    except GpuqError as exc:
        log.warning("cannot take the store lock again yet: %s", exc)
        return
    old, locks.store = locks.store, fresh
    await asyncio.to_thread(old.release)
