"""A client that a CLI helper's spare starts connecting while it waits for a call
(gpuq.cli.fast.spare), with the settings it was made for: the call that resolves the same
settings takes it (gpuq.cli.group.Context.client) while its channel is connected, and skips
the credential handshake and the connection (~2-3 ms). Outside a helper there is none.

A child that serves again after a call (gpuq.cli.fast.serve_again) keeps the client the call
used, connected, for the next one (keep_lent), with its open Submit stream.
"""

from __future__ import annotations

from typing import Any

_warm: list[tuple[Any, Any]] = []
_lent: list[tuple[Any, Any]] = []  # the clients this process's call uses, with their settings
_READY = 2  # grpc_connectivity_state GRPC_CHANNEL_READY (grpc.ChannelConnectivity.READY)


def warm_client() -> None:
    """Start connecting a client with this process's settings, for the next call. Returns at
    once: gRPC connects in its own threads while the spare waits for a call. Best effort: a
    coordinator that is down leaves nothing warm."""
    from gpuq.client import Client
    from gpuq.config.loading import load_settings

    try:
        settings = load_settings(None, None)
        client = Client(settings=settings)
        client.call_metadata(0)  # the credential (Unix socket) or the token file
        _connectivity(client, try_to_connect=True)
    except Exception:
        return
    _warm.append((settings, client))


def client_for(settings: Any) -> Any:
    """A client for `settings`: the warm one when it fits (take_warm_client), else a new one."""
    client = take_warm_client(settings)
    if client is None:
        from gpuq.client import Client

        client = Client(settings=settings)
    _lent.append((settings, client))
    return client


def keep_lent() -> None:
    """The call is over and this process serves another: the client it used waits for the
    next call, if it is still connected (others are closed)."""
    while _lent:
        settings, client = _lent.pop()
        try:
            connected = _connectivity(client, try_to_connect=False) == _READY
        except Exception:
            connected = False
        if connected and not _warm:
            _warm.append((settings, client))
        else:
            client.close()


def take_warm_client(settings: Any) -> Any:
    """The warm client when it was made for exactly these settings (the caller's environment
    and config file resolve the same) and its channel is connected now, else None (a channel
    that failed would wait out gRPC's reconnection backoff instead of trying at once)."""
    if not _warm:
        return None
    made_for, client = _warm.pop()
    try:
        ready = _connectivity(client, try_to_connect=False) == _READY
    except Exception:
        ready = False
    if ready and made_for == settings:
        return client
    client.close()  # its channel, and a Submit stream a call before left open
    return None


def _connectivity(client: Any, try_to_connect: bool) -> int:
    """The first channel's state, asked of gRPC's core directly: the public subscribe() starts
    a polling thread that holds every call up by up to 200 ms."""
    channel = client._connection.channels[0]
    return int(channel._channel.check_connectivity_state(try_to_connect))
