"""Stubs for the C extension built from gpuq/agent/native (see forkserver.c there)."""

def serve(fd: int, ack_wait: float, /) -> None:
    """Answer spawn requests on the control socket `fd` until EOF; each spawn forks a
    supervisor that waits `ack_wait` seconds for the agent's ack once its job has ended."""

def probe_device_program() -> str:
    """Load and close a trivial cgroup device program, RLIMIT_MEMLOCK raised around the load
    as for a job: "" when it loaded, else why not (gpuq admin doctor)."""
