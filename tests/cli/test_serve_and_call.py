"""``inplace-extension serve`` over real sockets (plain HTTP and --self-signed TLS), driven by ``call``."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from .conftest import FIXTURES, Server, clean_env, run_cli

StartServer = Callable[..., Server]
API = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"


def test_serve_plain_http_answers_discovery_and_can_update(start_server: StartServer, tmp_path: Path) -> None:
    server = start_server("--listen", "127.0.0.1:0", "--plain-http")
    reply = httpx.post(f"{server.url}{API}/discovery?timeout=10s", content=b'{"kind":"DiscoveryRequest"}')
    assert reply.status_code == 200
    assert reply.json() == json.loads((FIXTURES / "discovery" / "response.explicit.json").read_text())
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}

    env = clean_env(tmp_path / "state")
    called = run_cli(
        "call",
        "can-update-machine",
        str(FIXTURES / "can_update_machine" / "4A.request.json"),
        "--url",
        server.url,
        env=env,
    )
    assert called.returncode == 0, called.stderr
    answer = json.loads(called.stdout)
    assert answer["status"] == "Success"
    # patches are printed decoded, for people
    assert answer["machinePatch"]["patch"] == [{"op": "replace", "path": "/spec/version", "value": "v1.31.0"}]


def test_call_reads_yaml_and_exits_1_on_failure(start_server: StartServer, tmp_path: Path) -> None:
    server = start_server("--listen", "127.0.0.1:0", "--plain-http")
    request = tmp_path / "req.yaml"
    request.write_text("kind: UpdateMachineRequest\ndesired:\n  machine: {kind: Machine}\n")
    called = run_cli(
        "call", "UpdateMachine", str(request), "--url", server.url, env=clean_env(tmp_path / "s")
    )
    assert called.returncode == 1
    answer = json.loads(called.stdout)
    assert answer["message"].startswith("InvalidRequest: desired.machine.metadata: missing")
    assert answer["retryAfterSeconds"] == 0


def test_serve_self_signed_tls_is_verified_with_the_printed_ca(
    start_server: StartServer, tmp_path: Path
) -> None:
    tls_dir = tmp_path / "tls"
    server = start_server("--listen", "127.0.0.1:0", "--self-signed", "--tls-dir", str(tls_dir))
    assert server.url.startswith("https://")
    assert any(f"trust {tls_dir / 'ca.crt'}" in line for line in server.output)
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    reply = httpx.post(f"{server.url}{API}/discovery", content=b"{}", verify=context)
    assert reply.json()["status"] == "Success"

    env = clean_env(tmp_path / "state")
    body = str(FIXTURES / "discovery" / "request.json")
    trusted = run_cli(
        "call", "discovery", body, "--url", server.url, "--cacert", str(tls_dir / "ca.crt"), env=env
    )
    assert trusted.returncode == 0, trusted.stderr
    untrusted = run_cli("call", "discovery", body, "--url", server.url, env=env)
    assert untrusted.returncode == 2
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    insecure = run_cli("call", "discovery", body, "--url", server.url, "--insecure", env=env)
    assert insecure.returncode == 0


def test_serve_refuses_to_start_without_a_tls_choice(tmp_path: Path) -> None:
    result = run_cli("serve", "--listen", "127.0.0.1:0", env=clean_env(tmp_path))
    assert result.returncode == 2
    assert "TLS needs --tls-cert/--tls-key" in result.stderr


def test_serve_reports_bad_settings_by_name(tmp_path: Path) -> None:
    env = clean_env(tmp_path) | {"INPLACE_MAX_PARALLEL_RUNS": "0"}
    result = run_cli("serve", "--plain-http", env=env)
    assert result.returncode == 2
    assert "inplace-extension: INPLACE_MAX_PARALLEL_RUNS=0: must be at least 1" in result.stderr


def test_real_server_refuses_25_mib_early_and_keeps_serving(start_server: StartServer) -> None:
    server = start_server("--listen", "127.0.0.1:0", "--plain-http")
    big = b"[" + b"0," * (25 * 1024 * 1024 // 2) + b"0]"
    reply = httpx.post(
        f"{server.url}{API}/canupdatemachineset/can-update-machineset", content=big, timeout=30
    )
    assert reply.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is enforced while reading
        for _ in range(30):
            yield b" " * (1024 * 1024)

    try:
        chunked = httpx.post(f"{server.url}{API}/updatemachine/update-machine", content=chunks(), timeout=30)
        assert chunked.status_code == 413
    except httpx.WriteError:
        pass  # the server answered and closed while the client was still sending: also a refusal
    hostile = httpx.post(
        f"{server.url}{API}/updatemachine/update-machine", content=b"[" * 10_000 + b"]" * 10_000
    )
    assert hostile.status_code == 200
    assert hostile.json()["message"].startswith("InvalidRequest: (body): invalid JSON")
    assert httpx.post(f"{server.url}{API}/discovery", content=b"{}").json()["status"] == "Success"
