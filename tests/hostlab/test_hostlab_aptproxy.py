"""The lab's apt proxy: refuses everything but GET/HEAD to allow-listed mirrors, serves cached packages.

Runs the real server on loopback; no request here reaches an upstream mirror.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostlab.aptproxy import ProxyServer


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[ProxyServer, Path, io.StringIO]]:
    cache = tmp_path / "cache"
    cache.mkdir()
    log = io.StringIO()
    server = ProxyServer(("127.0.0.1", 0), {"deb.debian.org"}, cache, log)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, cache, log
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _request(server: ProxyServer, method: str, target: str) -> tuple[int, dict[str, str], bytes]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=10)
    try:
        conn.request(method, target)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "target", "why"),
    [
        ("GET", "http://example.com/", b"host not allowed: example.com"),
        ("GET", "http://deb.debian.org.evil.test/debian/", b"host not allowed: deb.debian.org.evil.test"),
        ("GET", "https://deb.debian.org/debian/", b"host not allowed"),
        ("POST", "http://deb.debian.org/debian/", b"only GET and HEAD"),
        ("DELETE", "http://deb.debian.org/debian/", b"only GET and HEAD"),
        ("CONNECT", "deb.debian.org:443", b"CONNECT not allowed"),
    ],
)
def test_refuses_with_403(
    proxy: tuple[ProxyServer, Path, io.StringIO], method: str, target: str, why: bytes
) -> None:
    status, _, body = _request(proxy[0], method, target)
    assert status == 403
    assert why in body


def test_serves_cached_packages_without_upstream(proxy: tuple[ProxyServer, Path, io.StringIO]) -> None:
    server, cache, log = proxy
    url = "http://deb.debian.org/debian/pool/main/t/tree/tree_2.1.0-1_amd64.deb"
    (cache / hashlib.sha256(url.encode()).hexdigest()).write_bytes(b"not really a deb")
    status, headers, body = _request(server, "GET", url)
    assert (status, body) == (200, b"not really a deb")
    assert headers["x-hostlab-cache"] == "HIT"
    status, headers, body = _request(server, "HEAD", url)
    assert (status, headers["content-length"], body) == (200, "16", b"")
    assert "cache HIT http://deb.debian.org/debian/pool/main/t/tree/tree_2.1.0-1_amd64.deb" in log.getvalue()
