"""A comparing front for the service's replicas: the one URL of the ExtensionConfig, which hands CAPI's
requests to the replicas **in turn, one request each** (not one connection each: CAPI's client keeps its
connection open, so a TCP balancer would give one replica every call of that connection), and asks each
request of the other replica too, to compare the answers.

It terminates CAPI's TLS (a serving certificate from the lab's PKI, as the replicas have) and, for each
request CAPI sends:

1. ``first``: the request to the replica whose turn it is (the next one if that replica refuses the
   connection: killed, as kube-proxy stops sending to an endpoint that is not ready). CAPI gets this
   answer, as it would get it through a Service, before the two calls below are made;
2. ``shadow``: the same request to the next replica in turn (a shadow call: CAPI never sees it);
3. ``again``: the same request to the first replica once more.

The shadow answer is taken between the first replica's two answers, so a change of the cluster between
the calls (a Job ending, a Node turning Ready) shows in ``first`` and ``again`` too: two replicas are one
service when the shadow's answer is of the same class as one of the first replica's two
(:func:`answer_class`). The calls are real calls of the hooks, which the service must answer alike however
often it is asked (CAPI itself asks again); none is retried.

A test harness, not a stand-in: nothing in a cluster sends every request twice. What it stands for is
the Service of the Deployment (kube-proxy), as ``balancer.py``'s forwarder does, at request granularity.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

TIMEOUT = 60.0  # CAPI's own timeout of a hook call is shorter; a replica that takes this long is stuck


@dataclass(frozen=True)
class Answer:
    """One replica's answer to one request (None code: the call did not reach it)."""

    port: int
    code: int | None
    body: bytes


@dataclass(frozen=True)
class Exchange:
    """One of CAPI's requests and the answers of :mod:`front`'s three calls."""

    path: str
    request: bytes
    first: Answer
    shadow: Answer | None  # None: only one replica served at that moment
    again: Answer | None

    @property
    def hook(self) -> str:
        """The hook's path segment (``updatemachine``, ``canupdatemachine``, ``discovery``...)."""
        parts = self.path.split("?")[0].strip("/").split("/")
        return parts[2] if len(parts) > 2 else parts[-1]

    @property
    def machine(self) -> str | None:
        """The Machine an UpdateMachine request is about (desired Machine's name)."""
        try:
            desired = json.loads(self.request).get("desired", {})
        except ValueError:
            return None
        name = desired.get("machine", {}).get("metadata", {}).get("name")
        return name if isinstance(name, str) else None

    def compared(self) -> bool:
        """Both replicas answered (the shadow and the first replica's second call reached them)."""
        return (
            self.shadow is not None
            and self.again is not None
            and self.shadow.code is not None
            and self.again.code is not None
        )

    def moved(self) -> bool:
        """The first replica's two answers differ: the cluster changed between the calls."""
        assert self.again is not None
        return answer_class(self.hook, self.first) != answer_class(self.hook, self.again)

    def consistent(self) -> bool:
        """The shadow's answer is of the class of the first replica's answer before or after it. When
        those two differ (:meth:`moved`), the update went on between them, and the shadow, asked in
        between, may have met any step of that move (``running: users``, ``running: kubelet_args``, ``update
        applied``; a lab run met a shadow answer unlike both as the update ended between the calls); then
        only its HTTP code and ``status`` must be one of the first replica's."""
        assert self.shadow is not None and self.again is not None
        shadow = answer_class(self.hook, self.shadow)
        if shadow in (answer_class(self.hook, self.first), answer_class(self.hook, self.again)):
            return True
        statuses = {answer_class(self.hook, answer)[:2] for answer in (self.first, self.again)}
        return self.moved() and shadow[:2] in statuses


def answer_class(hook: str, answer: Answer) -> tuple[Any, ...]:
    """What must be equal between replicas: for UpdateMachine the HTTP code, ``status``, ``message`` and
    whether ``retryAfterSeconds`` asks again (its value counts down with the clock between the calls);
    for every other hook the whole answer."""
    try:
        body = json.loads(answer.body)
    except ValueError:
        return (answer.code, answer.body)
    if hook == "updatemachine" and isinstance(body, dict):
        return (answer.code, body.get("status"), body.get("message"), bool(body.get("retryAfterSeconds")))
    return (answer.code, json.dumps(body, sort_keys=True))


class Front:
    """The comparing front on ``127.0.0.1:<port>`` (module docstring); :attr:`exchanges` in CAPI's order."""

    def __init__(self, cert: Path, key: Path, ca: Path) -> None:
        self._backends: list[int] = []
        self._turn = 0
        self._lock = threading.Lock()
        self.exchanges: list[Exchange] = []
        self.last_first: int | None = None  # the port of the replica CAPI's last request went to
        verify = ssl.create_default_context(cafile=str(ca))
        self._client = httpx.Client(verify=verify, timeout=TIMEOUT)
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as CAPI's client expects

            def do_POST(self) -> None:
                front._handle(self, "POST")

            def do_GET(self) -> None:
                front._handle(self, "GET")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="front", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def set_backends(self, ports: list[int]) -> None:
        """The replicas' ports from now on."""
        with self._lock:
            self._backends = list(ports)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _call(self, port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        try:
            response = self._client.request(
                method, f"https://127.0.0.1:{port}{path}", content=body, headers=headers
            )
        except httpx.TransportError:
            return Answer(port, None, b"")
        return Answer(port, response.status_code, response.content)

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        headers = {"Content-Type": handler.headers.get("Content-Type") or "application/json"}
        with self._lock:
            backends = list(self._backends)
            turn = self._turn
            self._turn += 1
        first: Answer | None = None
        order = [backends[(turn + i) % len(backends)] for i in range(len(backends))]
        for index, port in enumerate(order):
            answer = self._call(port, method, handler.path, body, headers)
            if answer.code is not None:
                first = answer
                order = order[index:]
                break
        if first is None:  # no replica listens: CAPI sees the connection end, as through a Service
            handler.close_connection = True
            with contextlib.suppress(OSError):
                handler.send_error(502)
            return
        self.last_first = first.port
        # CAPI has its answer before the comparing calls: they never lengthen its call
        handler.send_response(first.code or 502)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(first.body)))
        handler.end_headers()
        handler.wfile.write(first.body)
        handler.wfile.flush()
        shadow = again = None
        if len(order) > 1:
            shadow = self._call(order[1], method, handler.path, body, headers)
            again = self._call(first.port, method, handler.path, body, headers)
        with self._lock:
            self.exchanges.append(Exchange(handler.path, body, first, shadow, again))
