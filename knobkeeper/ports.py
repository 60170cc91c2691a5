"""Listening ports for services that restart: keep them out of the kernel's ephemeral range.

Linux hands every outgoing connection, and every `bind(port 0)`, a local port from its ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default). A service whose fixed port lies in
that range can find it held by someone else's connection when it restarts, and a vLLM instance takes
dozens of ephemeral ports itself (torch.distributed, ZMQ, UCX listeners) before it binds its NIXL side
channel, late in its start-up. Seen in a fresh clone's `make test` (2026-12-03): decode's side-channel
port, picked with bind(port 0), was taken when decode restarted; vLLM 0.32.0's handshake listener
thread died of "Address already in use" and the engine waited for it forever (its gate timed out after
600 s). So a port picked here for a service (tests, benchmarks, the local Slurm cluster) comes from
below the ephemeral range, where only an explicit bind takes one, and `check` warns about a side
channel inside it.

A leaf module (imports nothing of knobkeeper): the engine families read the range from here.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default; the host's own range is read where the process runs on it (`ephemeral_range`).
DEFAULT_EPHEMERAL = (32768, 60999)
# Below this are the well-known and commonly configured ports (ssh 22, Prometheus 9090, ...).
LOWEST = 10000
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_handed_out: set[int] = set()


def ephemeral_range(path: Path = RANGE_FILE) -> tuple[int, int]:
    """(first, last) of this machine's ephemeral ports; Linux's default where it cannot be read."""
    try:
        first, last = (int(part) for part in path.read_text().split())
        return first, last
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def in_ephemeral_range(port: int, ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL) -> bool:
    return ephemeral[0] <= port <= ephemeral[1]


def _free_on(port: int, addresses: tuple[str, ...]) -> bool:
    for address in addresses:
        with socket.socket() as sock:
            try:   # no SO_REUSEADDR: a port with a connection in TIME_WAIT is not taken either
                sock.bind((address, port))
            except OSError:
                return False
    return True


def free_port(*addresses: str, rng: random.Random | None = None) -> int:
    """A TCP port free on every address (default 127.0.0.1) right now, outside the ephemeral range
    (below it; above it where the range starts too low to leave room), and not handed out before by
    this process. From a random place in the pool, so that processes picking at once rarely meet."""
    addresses = addresses or ("127.0.0.1",)
    first, last = ephemeral_range()
    pools = [range(LOWEST, first)] if first - LOWEST >= 1000 else []
    if last < 65535:
        pools.append(range(last + 1, 65536))
    pools = pools or [range(1024, 65536)]          # an odd range with no room outside it: any port
    rng = rng or random.SystemRandom()
    rng.shuffle(pools)
    for pool in pools:
        start = rng.randrange(len(pool))
        for i in range(len(pool)):
            port = pool[(start + i) % len(pool)]
            if port not in _handed_out and _free_on(port, addresses):
                _handed_out.add(port)
                return port
    raise OSError(f"no free TCP port outside the ephemeral range {first}-{last} on {', '.join(addresses)}")
