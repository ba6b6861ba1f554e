"""The health gate's user-defined checks: from the capabilities file to an HTTP GET against the host."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from inplace_extension.capabilities_file import CapabilitiesFileError, parse_capabilities
from inplace_extension.inplace.custom import HealthCheck
from inplace_extension.kubeaware import health


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_checks_pass_fail_and_name_what_failed(port: int) -> None:
    ok = HealthCheck("app", f"http://{{address}}:{port}/healthz")
    bad = HealthCheck("ready", f"http://127.0.0.1:{port}/ready")
    gone = HealthCheck("gone", f"http://{{address}}:{free_port()}/", timeout_seconds=2)
    assert health.first_failing([ok], "127.0.0.1") is None
    assert health.first_failing([ok, bad], "127.0.0.1") == "check ready: HTTP 503, expected 200"
    assert health.first_failing([gone, bad], "127.0.0.1") == "check gone: ConnectError"
    assert health.first_failing([ok], None) == "check app: the host address is not known"
    assert health.first_failing([HealthCheck("ready", bad.url, status=503)], None) is None


def test_ipv6_addresses_are_bracketed() -> None:
    check = HealthCheck("app", "http://{address}:9100/metrics")
    assert health.url_for(check, "fd00::7") == "http://[fd00::7]:9100/metrics"
    assert health.url_for(check, "10.0.0.7") == "http://10.0.0.7:9100/metrics"


def test_the_capabilities_file_declares_checks_and_refuses_bad_ones(tmp_path: Path) -> None:
    table = parse_capabilities(
        "health_checks:\n"
        "  - name: node_exporter\n"
        "    url: http://{address}:9100/metrics\n"
        "  - name: app\n"
        "    url: https://10.0.0.1/ready\n"
        "    status: 204\n"
        "    timeout_seconds: 2\n"
    )
    assert table.health_checks == (
        HealthCheck("node_exporter", "http://{address}:9100/metrics"),
        HealthCheck("app", "https://10.0.0.1/ready", 204, 2.0),
    )
    with pytest.raises(CapabilitiesFileError, match=r"line 3: health_checks\[0\]\.url"):
        parse_capabilities("health_checks:\n  - name: x\n    url: file:///etc/passwd\n")
