"""Allow-listed HTTP forward proxy on a lab's gateway address: the only way out of a lab host.

Lab hosts have no default route; apt in each host is configured with
``Acquire::http::Proxy "http://<gateway>:3142"``. This proxy forwards plain-HTTP GET and HEAD only to
the mirror hosts it is given (default: the hosts in this machine's own apt sources), refuses everything
else with 403 (CONNECT, other methods, other hosts), and caches immutable files (``.deb`` and
``by-hash``) in a directory shared by all labs so repeated runs are fast. One log line per request.

Run by hostlab.network as ``python -m hostlab.aptproxy --listen 10.77.N.1:3142 --cache DIR --log-file F``.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from hostlab.config import machine_apt_hosts

PASS_REQUEST_HEADERS = ("if-modified-since", "range", "if-range", "cache-control", "user-agent")
PASS_RESPONSE_HEADERS = ("content-type", "last-modified", "etag", "content-range", "accept-ranges")
UPSTREAM_TIMEOUT = 60


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], allow: set[str], cache: Path | None, log: TextIO) -> None:
        super().__init__(address, ProxyHandler)
        self.allow = allow
        self.cache = cache
        self.log = log
        self.log_lock = threading.Lock()


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hostlab-aptproxy/1"
    server: ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        with self.server.log_lock:
            self.server.log.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} {format % args}\n")
            self.server.log.flush()

    def _refuse(self, code: int, why: str) -> None:
        body = why.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:
        self._refuse(403, "hostlab aptproxy: CONNECT not allowed\n")

    def do_POST(self) -> None:
        self._refuse(403, "hostlab aptproxy: only GET and HEAD are allowed\n")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def do_HEAD(self) -> None:
        self._forward(head=True)

    def do_GET(self) -> None:
        self._forward(head=False)

    def _cache_path(self, path: str) -> Path | None:
        if self.server.cache is None or not (path.endswith(".deb") or "/by-hash/" in path):
            return None
        return self.server.cache / hashlib.sha256(self.path.encode()).hexdigest()

    def _forward(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        host = (url.hostname or "").lower()
        if url.scheme != "http" or host not in self.server.allow:
            self._refuse(403, f"hostlab aptproxy: host not allowed: {host or self.path[:80]}\n")
            return
        cached = self._cache_path(url.path)
        if cached is not None and cached.is_file():
            size = cached.stat().st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("X-Hostlab-Cache", "HIT")
            self.end_headers()
            self.log_message("cache HIT %s (%d bytes)", self.path, size)
            if not head:
                with cached.open("rb") as src:
                    while chunk := src.read(1 << 16):
                        self.wfile.write(chunk)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() in PASS_REQUEST_HEADERS}
        if cached is not None:  # fetch the whole file so it can be cached
            headers = {k: v for k, v in headers.items() if k.lower() not in ("range", "if-range")}
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        try:
            conn = http.client.HTTPConnection(host, url.port or 80, timeout=UPSTREAM_TIMEOUT)
            conn.request("HEAD" if head else "GET", target, headers=headers)
            resp = conn.getresponse()
            body = b"" if head else resp.read()
        except OSError as exc:
            self._refuse(502, f"hostlab aptproxy: upstream error: {exc}\n")
            return
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() in PASS_RESPONSE_HEADERS:
                self.send_header(key, value)
        length = resp.getheader("Content-Length", "0") if head else str(len(body))
        self.send_header("Content-Length", length)
        self.end_headers()
        if not head:
            self.wfile.write(body)
            if cached is not None and resp.status == 200:
                tmp = cached.with_name(f"{cached.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_bytes(body)
                tmp.replace(cached)  # atomic: labs sharing the cache never see half a file
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hostlab.aptproxy", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="ADDRESS:PORT, the lab gateway address")
    parser.add_argument("--cache", type=Path, help="directory for cached .deb and by-hash files")
    parser.add_argument("--allow", action="append", default=[], help="allowed mirror host (repeatable)")
    parser.add_argument("--log-file", type=Path, help="request log (default: stdout)")
    args = parser.parse_args(argv)
    address, _, port = args.listen.rpartition(":")
    if not address or not port.isdigit():
        parser.error(f"--listen must be ADDRESS:PORT, got {args.listen!r}")
    allow = {host.lower() for host in args.allow} or machine_apt_hosts()
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
    log: TextIO = args.log_file.open("a") if args.log_file else sys.stdout
    server = ProxyServer((address, int(port)), allow, args.cache, log)
    log.write(f"aptproxy on {args.listen}, allowed: {sorted(allow)}, cache: {args.cache or 'off'}\n")
    log.flush()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
