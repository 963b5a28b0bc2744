"""The long-running processes: `gpuq coordinator`, `gpuq agent` and `gpuq serve` (both).

An agent starts its fork server before anything imports grpc (DESIGN.md: a process that serves
gRPC must not fork-and-exec jobs), which is why the grpc-using modules are imported inside the
functions here, after that point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuq.agent.run_folder import agent_run_dir
from gpuq.config.settings import Settings
from gpuq.errors import GpuqError
from gpuq.identity import create_key_file, read_key_file, service_uid

if TYPE_CHECKING:
    from gpuq.agent.jobs.fork_server import ForkServer
    from gpuq.agent.node_agent import Agent
    from gpuq.coordinator.serving import RunningCoordinator

log = logging.getLogger("gpuq")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in ("alembic", "apscheduler"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))


def run_coordinator(settings: Settings) -> None:
    asyncio.run(_main(settings, coordinator=True, fork_server=None))


def run_agent(settings: Settings) -> None:
    fork_server = _start_fork_server()
    asyncio.run(_main(settings, coordinator=False, fork_server=fork_server))


def run_serve(settings: Settings) -> None:
    fork_server = _start_fork_server()
    asyncio.run(_main(settings, coordinator=True, fork_server=fork_server))


def _start_fork_server() -> ForkServer:
    if "grpc" in sys.modules:  # pragma: no cover - a programming error, caught by tests
        raise RuntimeError("the fork server must start before grpc is imported")
    from gpuq.agent.jobs.fork_server import ForkServer

    return ForkServer.start()


async def _main(settings: Settings, *, coordinator: bool, fork_server: ForkServer | None) -> None:
    """Run until SIGINT or SIGTERM; a coordinator that must stop on its own (it lost its store
    to another one) stops the same way, then raises what stopped it."""
    stopped = asyncio.Event()
    fatal: list[GpuqError] = []

    def stop_for(error: GpuqError) -> None:
        fatal.append(error)
        stopped.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    running = await _start_coordinator(settings, stopped, stop_for) if coordinator else None
    if coordinator and running is None:
        log.info("stopped while standing by")
        return
    agent_task = agent = None
    try:
        if fork_server is not None:
            agent = _make_agent(settings, fork_server, embedded=coordinator)
            agent_task = asyncio.create_task(agent.run(), name="agent")
            agent_task.add_done_callback(lambda _: stopped.set())
        await stopped.wait()
    finally:
        log.info("shutting down (running jobs keep running under their supervisors)")
        if agent_task is not None:
            if agent is not None and not agent_task.done():
                await agent.settle(ACK_WAIT)
            agent_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent_task
            if not settings.agent.run_dir:  # the default folder keyed by home: none left behind
                with contextlib.suppress(OSError):
                    settings.agent_run_root.rmdir()
        if running is not None:
            await running.stop()
    if fatal:
        raise fatal[0]


async def _start_coordinator(
    settings: Settings, stopped: asyncio.Event, on_fatal: Callable[[GpuqError], None]
) -> RunningCoordinator | None:
    """The coordinator, started; None when `stopped` is set first (a standby can wait long
    for its turn, and SIGTERM must still end it)."""
    from gpuq.coordinator.locks import StandbyStopped
    from gpuq.coordinator.serving import start_coordinator

    if not settings.coordinator.standby:
        return await start_coordinator(settings, on_fatal=on_fatal)
    stop = threading.Event()
    starting = asyncio.create_task(start_coordinator(settings, on_fatal=on_fatal, stop=stop))
    stopping = asyncio.create_task(stopped.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if stopped.is_set():
        stop.set()  # the waiting thread sees it within a poll
    try:
        running = await starting
    except StandbyStopped:
        return None
    if stopped.is_set():  # it took over just as it was told to stop
        await running.stop()
        return None
    return running


SERVE_FAKE_SPEC = "4"  # what `gpuq serve` offers on a machine without an NVIDIA driver
# on a clean stop, how long the agent waits for the coordinator to record ends it reported
ACK_WAIT = 2.0


def _make_agent(settings: Settings, fork_server: ForkServer, *, embedded: bool) -> Agent:
    """The agent with its GPU backend: NVML, or the fakes --fake-gpus asks for. Only the
    embedded agent of `gpuq serve` (a laptop, a CI box, a first try) falls back to fakes where
    there is no driver, and says so; `gpuq agent` then offers no GPUs and says why, so a GPU
    server whose driver is broken never schedules real jobs onto imaginary GPUs."""
    from gpuq.agent.fake.gpu_backend import FakeGpuBackend
    from gpuq.agent.gpu.choose_backend import select_backend
    from gpuq.agent.node_agent import Agent, AgentOptions

    state_dir = settings.agent_state_dir
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fake_dir = state_dir / "fake-gpus"
    node = settings.agent.node_name
    backend, warning = select_backend(
        settings.agent.fake_gpus,
        node,
        state_dir=fake_dir,
        fabric_grace=settings.agent.fabric_grace,
    )
    problem = backend.inventory().problem
    if embedded and settings.agent.fake_gpus is None and problem:
        backend.close()
        backend = FakeGpuBackend(SERVE_FAKE_SPEC, node, state_dir=fake_dir)
        warning = (
            f"{problem}. gpuq serve offers {SERVE_FAKE_SPEC} FAKE GPUs instead: jobs will not "
            f"run on real GPUs. Start it with --fake-gpus SPEC to choose them and silence this."
        )
    if warning:
        log.warning("%s", warning)
    options = AgentOptions(
        settings=settings.agent,
        address=settings.coordinator_address,
        node_key=agent_node_key(settings),
        run_dir=agent_run_dir(settings),
        heartbeat_interval=settings.coordinator.heartbeat_interval,
        service_uid=service_uid(settings.coordinator.service_user),
    )
    return Agent(options, backend, fork_server)


def agent_node_key(settings: Settings) -> str:
    """This node's key: the configured [agent] node_key file; by default GPUQ_HOME/nodes/<node>.key,
    made if missing, which lets an agent that shares its coordinator's home (gpuq serve, or both
    services on one machine) register with no setup: writing there takes the coordinator's
    user. Any other node's key an admin makes with `gpuq admin node-key NODE`. A configured key
    may belong to the coordinator's service user ([coordinator] service_user): on a machine
    with both services (`gpuq admin install`) the root agent reads the coordinator's own copy
    of this node's key, in the coordinator's home, instead of keeping a second one."""
    if settings.agent.node_key:
        return read_key_file(
            settings.node_key_path, also_owner=service_uid(settings.coordinator.service_user)
        )
    return create_key_file(settings.node_key_path)


def serve_settings(settings: Settings, listen: str | None) -> Settings:
    """`gpuq serve` listens on the Unix socket only, unless --listen asks for TCP too."""
    return replace(settings, coordinator=replace(settings.coordinator, listen=listen))
