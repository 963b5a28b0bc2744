"""Stubs for the C extension built from gpuq/agent/native (see forkserver.c there)."""

def serve(fd: int, ack_wait: float, /) -> None:
    """Answer spawn requests on the control socket `fd` until EOF; each spawn forks a
    supervisor that waits `ack_wait` seconds for the agent's ack once its job has ended."""
