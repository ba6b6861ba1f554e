"""A STAND-IN for the Kubernetes Service in front of the service's replicas: a round-robin TCP
forwarder on loopback, as kube-proxy spreads the connections to a Service over its ready endpoints.

CAPI's ExtensionConfig names one URL; in a cluster that is the Service of the Deployment's two replicas.
Here the replicas are processes on the machine, each with its own port, so this forwarder listens on the
URL's port and hands each new connection to the next replica in turn (TLS passes through untouched: each
replica serves the lab's certificate). A replica that refuses the connection (killed) is skipped, as
kube-proxy stops sending to an endpoint that is not ready; the set of replicas can be replaced while it
runs (a rolling replacement of the Deployment's Pods). Only what kube-proxy does for connections: no
health checks of its own, no retries of a request.
"""

from __future__ import annotations

import contextlib
import itertools
import selectors
import socket
import threading
from collections.abc import Sequence

BUFFER = 65536


class Balancer:
    """Round-robin TCP forwarding from ``127.0.0.1:<port>`` to the current backends (module docstring)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._backends: list[int] = []
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._open: set[socket.socket] = set()
        self.connections: dict[int, int] = {}  # backend port -> connections handed to it
        self._thread = threading.Thread(target=self._accept, name="balancer", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def set_backends(self, ports: Sequence[int]) -> None:
        """The replicas' ports from now on (connections already forwarded stay where they are)."""
        with self._lock:
            self._backends = list(ports)

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.close()
        self._thread.join(10)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        with self._lock:
            backends = list(self._backends)
            start = next(self._turn)
        for offset in range(len(backends)):
            port = backends[(start + offset) % len(backends)]
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue  # not listening (killed): the next replica
            upstream.settimeout(None)
            with self._lock:
                self.connections[port] = self.connections.get(port, 0) + 1
            return upstream
        return None

    def _forward(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        with self._lock:
            self._open.update((client, upstream))
        peer = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            for sock in peer:
                selector.register(sock, selectors.EVENT_READ)
            try:
                while not self._stopped.is_set():
                    for key, _ in selector.select(timeout=1.0):
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(BUFFER)
                        if not data:
                            return
                        peer[source].sendall(data)
            except OSError:
                return  # either side reset (a killed replica): the client sees the connection end
            finally:
                with self._lock:
                    self._open.difference_update((client, upstream))
                for sock in peer:
                    with contextlib.suppress(OSError):
                        sock.close()
