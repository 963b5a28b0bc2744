"""A real rendezvous for multi-node tests: every rank connects to MASTER_ADDR:MASTER_PORT and
the ranks all-reduce (sum) one value each, as torch.distributed would, over plain TCP.

Standard library only, so that it runs wherever a job's Python does. Rank 0 listens on
MASTER_ADDR:MASTER_PORT, collects every other rank's value and sends the sum back to each;
the others connect (retrying until the deadline, since rank 0 may start later). Each rank
prints one line

    rank=R world=W sum=S addr=MASTER_ADDR:MASTER_PORT host=ITS_OWN_ADDRESS

(`host`: the local address of its socket, i.e. the address the other side sees) and exits 0.

`--fail-rank R` mimics a rank that dies inside a collective: after the all-reduce rank R exits
1, while every other rank blocks waiting for a second collective that never comes (rank 0
reading from rank R, the others reading from rank 0), as NCCL or gloo would hang, until
`--hang` seconds pass (then exit 3). Every wait has a deadline: it never hangs a test forever.

Exit codes: 0 done, 1 the chosen failure, 2 bad input or the rendezvous failed, 3 hung out.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def env_int(names: tuple[str, ...], default: int | None = None) -> int:
    """The first of `names` set in the environment, as an integer (torchrun's names first,
    then SLURM's, as a training script reads them)."""
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise SystemExit(f"allreduce: {name}={value!r} is not an integer") from None
    if default is None:
        raise SystemExit(f"allreduce: none of {', '.join(names)} is set")
    return default


def read_line(conn: socket.socket, deadline: float) -> str | None:
    """One line from `conn`, waiting until `deadline`; None at end of stream."""
    data = b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = conn.recv(1)
        except TimeoutError:
            raise SystemExit("allreduce: timed out waiting for a peer") from None
        if not chunk:
            return None
        data += chunk
    return data.decode().strip()


def connect(addr: str, port: int, deadline: float) -> socket.socket:
    """A connection to rank 0, retried until `deadline` (rank 0 may not listen yet)."""
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((addr, port), timeout=2)
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise SystemExit(f"allreduce: could not reach rank 0 at {addr}:{port}: {last}")


def serve(
    addr: str, port: int, world: int, value: int, deadline: float
) -> tuple[int, dict[int, socket.socket], str]:
    """Rank 0: collect every other rank's value, send the sum to each; (sum, connections by
    rank, this rank's own address)."""
    listener = socket.create_server((addr, port), reuse_port=False)
    listener.settimeout(max(0.01, deadline - time.monotonic()))
    own = str(listener.getsockname()[0])
    peers: dict[int, socket.socket] = {}
    total = value
    while len(peers) < world - 1:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            raise SystemExit(f"allreduce: only {len(peers) + 1} of {world} ranks came") from None
        line = read_line(conn, deadline)
        if line is None:
            conn.close()
            continue
        rank_text, value_text = line.split()
        peers[int(rank_text)] = conn
        total += int(value_text)
        own = str(conn.getsockname()[0])
    listener.close()
    for conn in peers.values():
        conn.sendall(f"{total}\n".encode())
    return total, peers, own


def hang(conn: socket.socket | None, seconds: float) -> None:
    """Block as a rank in a collective whose peer died: read from `conn` until `seconds`
    pass, whatever comes (an end of stream included), then give up with exit code 3."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if conn is not None:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if conn.recv(1):
                    continue
            except (TimeoutError, OSError):
                pass
            conn = None  # the peer is gone: the collective never completes
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    print("allreduce: gave up waiting for a collective that never came", file=sys.stderr)
    raise SystemExit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--value", type=int, help="this rank's value (default RANK+1)")
    parser.add_argument("--timeout", type=float, default=30.0, help="rendezvous deadline, s")
    parser.add_argument("--fail-after-rendezvous", action="store_true", help="see --fail-rank")
    parser.add_argument("--fail-rank", type=int, help="this rank exits 1 after the all-reduce")
    parser.add_argument("--hang", type=float, default=120.0, help="how long the others block")
    options = parser.parse_args(argv)
    if options.fail_after_rendezvous and options.fail_rank is None:
        options.fail_rank = 1
    addr = os.environ.get("MASTER_ADDR") or ""
    if not addr:
        raise SystemExit("allreduce: MASTER_ADDR is not set")
    port = env_int(("MASTER_PORT",))
    world = env_int(("WORLD_SIZE", "SLURM_NTASKS"), 1)
    rank = env_int(("RANK", "SLURM_PROCID"), 0)
    if not 0 <= rank < world:
        raise SystemExit(f"allreduce: rank {rank} is not in a world of {world}")
    value = rank + 1 if options.value is None else options.value
    deadline = time.monotonic() + options.timeout

    upstream: socket.socket | None = None
    peers: dict[int, socket.socket] = {}
    if rank == 0:
        total, peers, own = serve(addr, port, world, value, deadline)
    else:
        upstream = connect(addr, port, deadline)
        own = str(upstream.getsockname()[0])
        upstream.sendall(f"{rank} {value}\n".encode())
        answer = read_line(upstream, deadline)
        if answer is None:
            raise SystemExit("allreduce: rank 0 closed the connection before the sum")
        total = int(answer)
    print(f"rank={rank} world={world} sum={total} addr={addr}:{port} host={own}", flush=True)

    if options.fail_rank is not None:
        if rank == options.fail_rank:
            return 1
        hang(peers.get(options.fail_rank) if rank == 0 else upstream, options.hang)
    return 0


if __name__ == "__main__":
    sys.exit(main())
