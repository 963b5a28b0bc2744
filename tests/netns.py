"""Several nodes on one machine, each with a real address of its own: Linux network namespaces
for multi-node tests (issue 22), so that MASTER_ADDR and the nodes' addresses are real,
distinct addresses that a rendezvous connects to, and nothing leaves the machine.

`TestNetwork(count)` (a context manager) makes a bridge in the root namespace with the first
address of a private /24 no interface here uses (10.213.X.1, X random), and `count` network
namespaces gq-<suffix>-<i>, each with `lo` up and a veth pair: one end inside, named eth0, with
address 10.213.X.(i+2), the other end on the bridge. The namespaces get no default route and
the host's forwarding is left as it is, so a namespace reaches the bridge's subnet only. At the
end (a failed test too) every process still inside a namespace is killed, the namespaces, veths
and bridge are deleted, and it is checked that nothing named gq-<suffix>* is left.

`NetnsCluster` is tests/e2e's Cluster with its coordinator in the root namespace, listening on
the bridge address, and each agent inside a namespace of its own connecting over TCP: the
coordinator sees each node at its namespace's address. `start_netns_cluster(...)` starts one
(tests/e2e/conftest.py's `netns_cluster` fixture: nodes n0 and n1, 2 fake GPUs each).

Namespaces need root (CAP_NET_ADMIN) and iproute2: `netns_unavailable()` says why they cannot
be made here; `require_netns()` (which the fixtures call) skips for that reason outside CI, and
fails under CI=true (helpers.skip_or_fail).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from e2e_cluster import Cluster, pid_alive, wait_for

from gpuq.agent.jobs.job_folder import supervisor_alive
from gpuq.config.loading import load_settings

SUBNET_BASE = "10.213"  # 10.213.X.0/24: private, X chosen unused per network
NAME_PREFIX = "gq-"
IP_TIMEOUT = 15.0


class NetnsError(RuntimeError):
    """An `ip` command failed while a test network was made or removed."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS...`; raises NetnsError (with ip's message) when it fails and `check`."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
    )
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


@functools.cache
def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can): not root, no iproute2, or
    the kernel or a container refuses them. Tried once per session with a probe namespace and
    bridge, removed at once."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{NAME_PREFIX}probe-{secrets.token_hex(3)}"
    try:
        made = ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"`ip netns add` is not allowed here: {made.stderr.strip()}"
        bridge = ip("link", "add", probe, "type", "bridge", check=False)
        if bridge.returncode != 0:
            return f"`ip link add type bridge` is not allowed here: {bridge.stderr.strip()}"
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip` failed: {exc}"
    finally:
        ip("link", "del", probe, check=False)
        ip("netns", "del", probe, check=False)


def used_third_octets() -> set[int]:
    """The X of every 10.213.X.* address or route on this machine's root namespace."""
    text = ip("-o", "addr").stdout + ip("-4", "route").stdout
    pattern = re.compile(rf"\b{re.escape(SUBNET_BASE)}\.(\d+)\.")
    return {int(x) for x in pattern.findall(text)}


def netns_pids(name: str) -> list[int]:
    """The processes in namespace `name` (a zombie has left it already)."""
    done = ip("netns", "pids", name, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


@dataclass(frozen=True)
class Namespace:
    """One node's network namespace: its name, its address, and its veth's end on the bridge."""

    name: str
    index: int
    address: str
    host_end: str  # the veth end in the root namespace, on the bridge

    def command(self, args: Sequence[str]) -> list[str]:
        """`args` as a command that runs inside this namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `args` inside this namespace (subprocess.Popen's keywords: env, cwd, stdout...).
        `ip netns exec` execs the command: the Popen's pid is the command's."""
        return subprocess.Popen(self.command(args), **kwargs)

    def run(
        self, args: Sequence[str], timeout: float = 30.0, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run `args` inside this namespace to its end; its output as text."""
        kwargs.setdefault("capture_output", True)
        return subprocess.run(self.command(args), text=True, timeout=timeout, check=False, **kwargs)

    def pids(self) -> list[int]:
        """Every process now inside this namespace (an agent, its supervisors, their jobs)."""
        return netns_pids(self.name)

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every process inside this namespace, until none is left (new ones a dying
        parent started included); fails at the deadline."""
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise NetnsError(f"processes {pids} in namespace {self.name} outlived SIGKILL")
            time.sleep(0.02)


class TestNetwork:
    """A bridge and `count` namespaces on it, each with its own address in a private /24
    (see the module's docstring). Use it as a context manager; `close` removes everything."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, count: int) -> None:
        if not 1 <= count <= 200:
            raise ValueError(f"a test network has 1 to 200 namespaces, not {count}")
        self.count = count
        self.suffix = secrets.token_hex(3)
        self.prefix = f"{NAME_PREFIX}{self.suffix}"
        self.bridge = f"{self.prefix}-br"
        self.octet = 0
        self.namespaces: list[Namespace] = []

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{SUBNET_BASE}.{self.octet}.0/24")

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the bridge (the coordinator listens here)."""
        return f"{SUBNET_BASE}.{self.octet}.1"

    def addresses(self) -> list[str]:
        """Each namespace's address, in order."""
        return [ns.address for ns in self.namespaces]

    def __getitem__(self, index: int) -> Namespace:
        return self.namespaces[index]

    # ---- making and removing -----------------------------------------------------------------

    def open(self) -> TestNetwork:
        """Make the bridge and the namespaces (removing what was made if a step fails)."""
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def _open(self) -> None:
        used = used_third_octets()
        free = [x for x in range(1, 255) if x not in used]
        if not free:
            raise NetnsError(f"every {SUBNET_BASE}.X.0/24 is in use on this machine")
        self.octet = secrets.choice(free)
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for index in range(self.count):
            name = f"{self.prefix}-{index}"
            namespace = Namespace(
                name, index, f"{SUBNET_BASE}.{self.octet}.{index + 2}", f"{self.prefix}-h{index}"
            )
            ip("netns", "add", name)
            self.namespaces.append(namespace)
            # the inner end is made inside the namespace: no transient name in the root one
            ip("link", "add", namespace.host_end, "type", "veth",
               "peer", "name", "eth0", "netns", name)  # fmt: skip
            ip("link", "set", namespace.host_end, "master", self.bridge)
            ip("link", "set", namespace.host_end, "up")
            inside = ("-n", name)
            ip(*inside, "link", "set", "lo", "up")
            ip(*inside, "addr", "add", f"{namespace.address}/24", "dev", "eth0")
            ip(*inside, "link", "set", "eth0", "up")
        self.wait_reachable()

    def wait_reachable(self, timeout: float = 10.0) -> None:
        """Until every bridge port forwards and every namespace's eth0 has its carrier: from
        then on a namespace reaches the bridge and the others."""
        deadline = time.monotonic() + timeout
        for namespace in self.namespaces:
            while True:
                port = ip("-d", "link", "show", namespace.host_end).stdout
                inner = ip("-n", namespace.name, "link", "show", "eth0").stdout
                if "state forwarding" in port and "LOWER_UP" in inner:
                    break
                if time.monotonic() > deadline:
                    raise NetnsError(f"{namespace.name}'s link is not up: {port} {inner}")
                time.sleep(0.02)

    def close(self) -> None:
        """Kill every process left in the namespaces, delete them with their veths and the
        bridge; fails if anything named gq-<suffix>* is left."""
        errors: list[str] = []
        for namespace in self.namespaces:
            try:
                namespace.kill_all()
            except NetnsError as exc:
                errors.append(str(exc))
        for namespace in self.namespaces:
            # deleting one end of a veth deletes both; the namespace's name goes with `del`
            ip("link", "del", namespace.host_end, check=False)
            ip("netns", "del", namespace.name, check=False)
        ip("link", "del", self.bridge, check=False)
        left = self.leftovers()
        if left or errors:
            raise NetnsError(f"test network {self.prefix} not fully removed: {errors} {left}")

    def leftovers(self) -> list[str]:
        """Namespaces and links named gq-<suffix>* that still exist."""
        names = ip("netns", "list").stdout.split() + re.findall(
            r"^\d+: ([^:@\s]+)", ip("-o", "link").stdout, re.MULTILINE
        )
        return sorted({n for n in names if n.startswith(self.prefix)})

    def __enter__(self) -> TestNetwork:
        return self.open()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


# ---- a gpuq cluster across namespaces ----------------------------------------------------------


class NetnsCluster(Cluster):
    """A coordinator in the root namespace, listening on the bridge address (plaintext TCP:
    nothing leaves the machine), and agents each in a namespace of its own, connecting to it
    over TCP, so that the coordinator sees each node at its namespace's address. Everything
    else is Cluster's (its client, submit, wait_state, gpuq...)."""

    def __init__(self, root: Path, network: TestNetwork, config: str = "") -> None:
        super().__init__(root, config)
        self.network = network
        self.node_namespaces: dict[str, Namespace] = {}
        config_file = self.home / "config.toml"
        text, found = re.subn(
            r'^listen = "127\.0\.0\.1:\d+"$',
            f'listen = "{network.bridge_address}:{free_port_on(network.bridge_address)}"\n'
            "insecure_tcp = true",
            config_file.read_text(),
            count=1,
            flags=re.MULTILINE,
        )
        assert found == 1, "Cluster's config.toml has no listen line to move to the bridge"
        # jobs' own gpuq commands (srun's FailJob) reach the coordinator by its Unix socket,
        # which a network namespace does not hide (a real node's users have TLS and a token)
        socket = f'job_coordinator = "unix:{self.home / "gpuq.sock"}"\n'
        assert "[agent]\n" in text, "Cluster's config.toml has no [agent] section"
        text = text.replace("[agent]\n", "[agent]\n" + socket, 1)
        config_file.write_text(text)

    def start_agent(self, name: str, fake_gpus: str, tcp: bool = True) -> None:
        """Start node `name`'s agent in the next namespace without one (Cluster's signature:
        a namespaced agent always connects over TCP)."""
        taken = {ns.name for ns in self.node_namespaces.values()}
        free = [ns for ns in self.network.namespaces if ns.name not in taken]
        assert free, f"no namespace left for node {name}"
        self.start_node(name, fake_gpus, free[0])

    def start_node(self, name: str, fake_gpus: str, namespace: Namespace) -> None:
        """Start node `name`'s agent inside `namespace`, with fake GPUs (a spec as
        --fake-gpus takes, e.g. "2xA100-80GB"), and wait until it is up with its GPUs."""
        args = [
            sys.executable, "-m", "gpuq.cli.main", "--home", str(self.home),
            "agent", "--node-name", name, "--fake-gpus", fake_gpus,
            "--coordinator", self.tcp_address, "--log-level", "debug",
        ]  # fmt: skip
        log = open(self.root / f"agent-{name}.log", "ab")  # noqa: SIM115 - lives with the process
        with log:
            self.agents[name] = namespace.popen(
                args, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.node_namespaces[name] = namespace
        self.wait_node(name, "up")

    def address(self, node: str) -> str:
        """The node's address: its namespace's, where the coordinator sees its agent."""
        return self.node_namespaces[node].address

    def run_folder(self, node: str) -> Path:
        """The node's agent's run folder (job folders: jobs/<id>/, their supervisors' pids)."""
        return load_settings(home=self.home).agent_run_root / node

    def supervisors(self, node: str) -> list[int]:
        """The pids of the node's job supervisors still running."""
        jobs = self.run_folder(node) / "jobs"
        found = (supervisor_alive(d) for d in jobs.iterdir()) if jobs.is_dir() else iter(())
        return [pid for pid in found if pid is not None]

    def kill_agent(self, node: str) -> list[int]:
        """kill -9 the node's agent and its job supervisors at once (a crash of gpuq on that
        node: the jobs' own processes are left, orphaned); the pids killed."""
        agent = self.agents[node]
        victims = [agent.pid, *self.supervisors(node)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        agent.wait(10)
        wait_for(lambda: not any(pid_alive(p) for p in victims), 10, f"node {node}'s gpuq to die")
        return victims

    def kill_node(self, node: str) -> None:
        """The node dies: kill -9 every process in its namespace (agent, supervisors, jobs)."""
        self.node_namespaces[node].kill_all()
        self.agents[node].wait(10)

    def cut(self, node: str) -> None:
        """The node's network goes silent (its bridge port down): its packets are dropped,
        connections hang rather than close, as when a machine loses power."""
        ip("link", "set", self.node_namespaces[node].host_end, "down")

    def mend(self, node: str) -> None:
        """The node's network is back."""
        ip("link", "set", self.node_namespaces[node].host_end, "up")


def free_port_on(address: str) -> int:
    """A TCP port free on `address` a moment ago."""
    import socket

    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


DEFAULT_NODES: Mapping[str, str] = {"n0": "2xA100-80GB", "n1": "2xA100-80GB"}


def require_netns() -> None:
    """Skip the test when namespaces cannot be made here (why); under CI=true fail it."""
    from helpers import skip_or_fail

    reason = netns_unavailable()
    if reason is not None:
        skip_or_fail(reason)


@contextlib.contextmanager
def start_netns_cluster(
    root: Path, nodes: Mapping[str, str] = DEFAULT_NODES, config: str = ""
) -> Iterator[NetnsCluster]:
    """A test network with one namespace per node, a coordinator on its bridge and each
    node's agent (name: fake GPU spec) in its namespace, up; all removed at the end."""
    with TestNetwork(len(nodes)) as network:
        cluster = NetnsCluster(root, network, config)
        try:
            cluster.start_coordinator()
            for (name, gpus), namespace in zip(nodes.items(), network.namespaces, strict=True):
                cluster.start_node(name, gpus, namespace)
            yield cluster
        finally:
            cluster.close()
