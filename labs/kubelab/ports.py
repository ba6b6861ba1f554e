"""Free loopback ports for lab components, never inside the ranges other lab components claim.

CAPD (in-memory backend) listens on 19000 and 20000-30000 for its fake workload API servers, so a
port handed to etcd, the apiserver or a controller must stay out of those ranges.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

RESERVED_PORTS = (range(19000, 19001), range(20000, 30001))


def free_port(avoid: Iterable[range] = RESERVED_PORTS) -> int:
    """A free loopback TCP port outside ``avoid`` (free when asked: the caller binds it soon)."""
    ranges = tuple(avoid)
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not any(port in r for r in ranges):
            return port
