"""Doctor's reachability check: can this machine reach its coordinator, as its agent would?

One cheap call per address, with a short deadline: the agent stream (AgentLink.Connect) opened
with the node's key and closed before registering. The coordinator checks the key before it
reads anything, so the answer says it all without registering the node or changing anything:
"first message must register" means the address answers, TLS holds and the key is accepted;
UNAUTHENTICATED means it answers but refuses this node (or, sent without a key, that it answers).
A client machine (no role) and the coordinator's own socket get the same call without a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from gpuq.admin.checks import Check, DoctorContext
from gpuq.admin.doctor_node import NOT_LOADED
from gpuq.config.settings import Settings, split_addresses
from gpuq.errors import GpuqError

PROBE_TIMEOUT = 5.0  # seconds an address has to answer
START_FIX = (
    "start the coordinator (systemctl start gpuq-coordinator, or gpuq serve), or correct the "
    "address ([agent] coordinator or GPUQ_COORDINATOR); a firewall must let this machine reach "
    "its port"
)


@dataclass(frozen=True, slots=True)
class Answer:
    address: str
    reached: bool  # something that speaks gpuq answered
    accepted: bool  # and it accepts this node's key
    detail: str  # what happened, in words


def reachability_checks(context: DoctorContext) -> list[Check]:
    if context.config_error:
        return [Check("coordinator", "skip", NOT_LOADED)]
    settings = context.settings
    found: list[Check] = []
    addresses = split_addresses(settings.coordinator_address)
    if "agent" in context.roles:
        found.append(_agent_check(settings, addresses))
    elif not context.roles:
        answers = [probe(a, settings, None, section="client") for a in addresses]
        found.append(_summary("coordinator", answers, need_key=False))
    own = f"unix:{settings.socket_path}"
    if "coordinator" in context.roles and not ("agent" in context.roles and own in addresses):
        answer = probe(own, settings, None, section="client")
        found.append(_summary("coordinator socket", [answer], need_key=False))
    return found


def _agent_check(settings: Settings, addresses: list[str]) -> Check:
    key, unchecked = _node_key(settings)
    metadata = None
    if key is not None:
        from gpuq.identity import node_metadata

        metadata = (node_metadata(settings.agent.node_name, key),)
    answers = [probe(a, settings, metadata, section="agent") for a in addresses]
    check = _summary("coordinator", answers, need_key=key is not None)
    if unchecked and check.status == "ok":
        return Check(check.name, "ok", f"{check.detail}; {unchecked}")
    return check


def _node_key(settings: Settings) -> tuple[str | None, str]:
    """This node's key, or None and why it is not checked (the key files' check says more)."""
    from gpuq.identity import read_key_file

    path = settings.node_key_path
    if not settings.agent.node_key and not path.exists():
        return None, f"the node key is not checked ({path} is made at the agent's first start)"
    try:
        return read_key_file(path), ""
    except GpuqError as error:
        return None, f"the node key is not checked ({error})"


def _summary(name: str, answers: list[Answer], *, need_key: bool) -> Check:
    """ok when an address answers (and accepts the node, when a key was sent); a list of
    addresses is a leader and its standbys, so one that answers is enough."""
    said = "; ".join(f"{a.address}: {a.detail}" for a in answers)
    if any(a.accepted or (a.reached and not need_key) for a in answers):
        return Check(name, "ok", said)
    refused = [a for a in answers if a.reached]
    if refused:
        node_fix = (
            "give this node the key the coordinator has for it: `gpuq admin node-key NODE` on the "
            "coordinator, copied here as [agent] node_key (mode 0600)"
        )
        return Check(name, "fail", f"the coordinator refuses this node: {said}", node_fix)
    return Check(name, "fail", f"no coordinator answers: {said}", START_FIX)


def probe(
    address: str,
    settings: Settings,
    metadata: tuple[tuple[str, str], ...] | None,
    *,
    section: str,
    timeout: float = PROBE_TIMEOUT,
) -> Answer:
    """Open the agent stream at `address`, send nothing, and read how it ends (see the module)."""
    from gpuq.tls import explain_unavailable
    from gpuq.v1 import agent_pb2_grpc

    try:
        channel, tls_on = _channel(address, settings, section)
    except GpuqError as error:
        return Answer(address, False, False, f"not tried: {error}")
    try:
        stub = agent_pb2_grpc.AgentLinkStub(channel)
        replies = stub.Connect(iter(()), metadata=metadata, timeout=timeout)
        next(replies, None)
        return Answer(address, True, False, "answered without ending the call (not gpuq?)")
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
    finally:
        channel.close()
    if code == grpc.StatusCode.INVALID_ARGUMENT and "register" in details:
        return Answer(address, True, True, "answers, and accepts this node's key")
    if code == grpc.StatusCode.UNAUTHENTICATED and metadata is None:
        return Answer(address, True, False, "answers")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return Answer(address, True, False, f"answers, but refuses this node: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Answer(address, False, False, f"no answer within {timeout:g} s")
    if code == grpc.StatusCode.UNAVAILABLE:
        why = explain_unavailable(details, tls_on, section) or _unreachable(details)
        return Answer(address, False, False, f"unreachable: {why}")
    return Answer(address, False, False, f"{code.name}: {_short(details)}")


def _channel(address: str, settings: Settings, section: str) -> tuple[grpc.Channel, bool]:
    """A channel as the agent (or a client) would open it: TLS for HOST:PORT when its section
    names a CA, with the node's certificate for an agent that has one."""
    from gpuq.tls import channel_credentials, is_unix

    if is_unix(address):
        return grpc.insecure_channel(address), False
    agent, client_ca = settings.agent, settings.client.tls_ca
    if section == "agent" and agent.tls_ca:
        credentials = channel_credentials(
            agent.tls_ca, agent.tls_cert, agent.tls_key, section="agent"
        )
        return grpc.secure_channel(address, credentials), True
    if section == "client" and client_ca:
        credentials = channel_credentials(client_ca, section="client")
        return grpc.secure_channel(address, credentials), True
    return grpc.insecure_channel(address), False


# what grpc's long UNAVAILABLE details end with, in words
_CAUSES = (
    ("No such file or directory", "no socket there (is the coordinator running?)"),
    ("Connection refused", "connection refused (nothing listens there)"),
    ("Permission denied", "permission denied (a coordinator private to another user?)"),
    ("DNS resolution failed", "the host name does not resolve"),
    ("No route to host", "no route to the host"),
    ("Network is unreachable", "the network is unreachable"),
    ("Connection timed out", "the connection timed out (a firewall?)"),
)


def _unreachable(details: str) -> str:
    for marker, words in _CAUSES:
        if marker in details:
            return words
    return _short(details)


def _short(details: str) -> str:
    text = " ".join(details.split())
    return text[:200] + "..." if len(text) > 200 else text
