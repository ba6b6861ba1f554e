"""inplace_extension.auth over real TLS: uvicorn on 127.0.0.1 with trustme certificates, called with httpx.

Refusals asserted here: a connection without a client certificate completes the handshake and gets 401
(CERT_OPTIONAL, so probes keep working); a certificate from another CA fails the TLS handshake itself.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trustme
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from inplace_extension.auth import (
    AuthConfigError,
    AuthMiddleware,
    AuthPolicy,
    ServerTls,
    server_tls,
)
from inplace_extension.settings import Settings

HOOK = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery"
TOKEN = "s3cr3t-token-for-people-0123456789"
DISCOVERY = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}


async def _discovery(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"status": "Success", "handlers": []})


async def _healthz(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def _app(policy: AuthPolicy) -> Starlette:
    routes = [Route(HOOK, _discovery, methods=["POST"]), Route("/healthz", _healthz)]
    return Starlette(routes=routes, middleware=[Middleware(AuthMiddleware, policy=policy)])


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def other_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA) -> dict[str, Path]:
    """Server certificate and key files, the client CA file, and a token file."""
    root = tmp_path_factory.mktemp("pki")
    server = ca.issue_cert("127.0.0.1", "inplace-extension.inplace-system.svc")
    paths = {
        "cert": root / "tls.crt",
        "key": root / "tls.key",
        "ca": root / "ca.crt",
        "token": root / "token",
    }
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    paths["token"].write_text(TOKEN + "\n")  # Secrets often end with a newline
    return paths


@contextmanager
def _serve(app: Starlette, tls: ServerTls) -> Iterator[str]:
    """Run uvicorn for real in a thread on an ephemeral loopback port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        **tls.uvicorn_options(),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: server.started, "uvicorn to start")
        yield f"https://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _client(ca: trustme.CA, client_cert: trustme.LeafCert | None = None) -> httpx.Client:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if client_cert is not None:
        client_cert.configure_cert(ctx)
    return httpx.Client(verify=ctx, timeout=10)


def _policy(pki: dict[str, Path], client_ca: bool, token: bool) -> AuthPolicy:
    settings = Settings(
        client_ca=pki["ca"] if client_ca else None,
        bearer_token_file=pki["token"] if token else None,
    )
    return AuthPolicy.build(settings.client_ca, settings.bearer_token_file, settings.plain_http)


def _tls(pki: dict[str, Path], client_ca: bool) -> ServerTls:
    return server_tls(pki["cert"], pki["key"], pki["ca"] if client_ca else None)


def test_client_ca_maps_to_optional_verification_against_that_ca(pki: dict[str, Path]) -> None:
    assert _tls(pki, client_ca=True) == ServerTls(
        str(pki["cert"]), str(pki["key"]), str(pki["ca"]), ssl.CERT_OPTIONAL
    )
    assert _tls(pki, client_ca=False) == ServerTls(str(pki["cert"]), str(pki["key"]), None, ssl.CERT_NONE)


def test_mtls_refuses_a_caller_without_certificate_and_accepts_one_signed_by_the_ca(
    pki: dict[str, Path], ca: trustme.CA, other_ca: trustme.CA
) -> None:
    with _serve(_app(_policy(pki, client_ca=True, token=False)), _tls(pki, client_ca=True)) as url:
        # each connection answers for its own certificate: an anonymous connection opened while one with a
        # certificate is open (and after it was used) is refused, and the other one stays accepted
        with _client(ca, ca.issue_cert("capi-controller-manager")) as capi, _client(ca) as anonymous:
            assert capi.post(url + HOOK, json=DISCOVERY).status_code == 200
            assert anonymous.post(url + HOOK, json=DISCOVERY).status_code == 401
            assert capi.post(url + HOOK, json=DISCOVERY).status_code == 200
            assert anonymous.post(url + HOOK, json=DISCOVERY).status_code == 401

        with _client(ca) as anonymous:
            refused = anonymous.post(url + HOOK, json=DISCOVERY)
            assert refused.status_code == 401
            assert refused.json() == {
                "error": "Unauthorized",
                "message": "a client certificate or a bearer token is required",
            }
            assert "www-authenticate" not in refused.headers  # no token configured: nothing to offer
            # probes present no certificate and must still work
            assert anonymous.get(url + "/healthz").text == "ok"
            # a token is no substitute when none is configured
            assert (
                anonymous.post(
                    url + HOOK, json=DISCOVERY, headers={"authorization": f"Bearer {TOKEN}"}
                ).status_code
                == 401
            )

        with _client(ca, ca.issue_cert("capi-controller-manager")) as capi:
            accepted = capi.post(url + HOOK, json=DISCOVERY)
            assert accepted.status_code == 200
            assert accepted.json()["status"] == "Success"

        # a certificate from a CA we do not trust fails the handshake: no HTTP answer at all
        with _client(ca, other_ca.issue_cert("impostor")) as impostor, pytest.raises(httpx.TransportError):
            impostor.post(url + HOOK, json=DISCOVERY)


def test_bearer_token_wrong_or_missing_is_401_without_echo_right_is_200(
    pki: dict[str, Path], ca: trustme.CA
) -> None:
    wrong = "wrong-token-that-must-not-echo-42"
    with (
        _serve(_app(_policy(pki, client_ca=False, token=True)), _tls(pki, client_ca=False)) as url,
        _client(ca) as c,
    ):
        missing = c.post(url + HOOK, json=DISCOVERY)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == 'Bearer realm="inplace-extension"'

        bad = c.post(
            url + HOOK,
            json={**DISCOVERY, "marker": "body-marker"},
            headers={"authorization": f"Bearer {wrong}"},
        )
        assert bad.status_code == 401
        assert wrong not in bad.text
        assert "body-marker" not in bad.text
        assert bad.content == missing.content  # one fixed body, whatever was sent

        for header in (f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"):
            assert c.post(url + HOOK, json=DISCOVERY, headers={"authorization": header}).status_code == 401, (
                header
            )

        ok = c.post(url + HOOK, json=DISCOVERY, headers={"authorization": f"bearer {TOKEN}"})
        assert ok.status_code == 200
        assert c.get(url + "/healthz").status_code == 200


def test_certificate_or_token_either_suffices_when_both_are_configured(
    pki: dict[str, Path], ca: trustme.CA
) -> None:
    with _serve(_app(_policy(pki, client_ca=True, token=True)), _tls(pki, client_ca=True)) as url:
        with _client(ca, ca.issue_cert("capi")) as capi:
            assert capi.post(url + HOOK, json=DISCOVERY).status_code == 200
        with _client(ca) as person:
            assert (
                person.post(
                    url + HOOK, json=DISCOVERY, headers={"authorization": f"Bearer {TOKEN}"}
                ).status_code
                == 200
            )
            assert person.post(url + HOOK, json=DISCOVERY).status_code == 401
            assert (
                person.post(
                    url + HOOK, json=DISCOVERY, headers={"authorization": "Bearer nope-nope-nope-nope"}
                ).status_code
                == 401
            )


def test_token_is_compared_in_constant_time(pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real_compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # auth.py looks it up on the module at call time
    policy = _policy(pki, client_ca=False, token=True)
    scope = {"type": "http", "path": HOOK, "headers": [(b"authorization", b"Bearer " + TOKEN.encode())]}
    assert AuthMiddleware(_app(policy), policy)._refusal(scope) is None
    # equal-length digests, so neither the length nor a common prefix of the token can be timed
    assert calls == [(hashlib.sha256(TOKEN.encode()).digest(), hashlib.sha256(TOKEN.encode()).digest())]


async def _never_called(scope: object, receive: object, send: object) -> None:
    raise AssertionError("the app must not run for a refused request")


@pytest.mark.anyio
async def test_client_ca_fails_closed_when_the_server_reports_no_certificates(pki: dict[str, Path]) -> None:
    # ASGITransport, like uvicorn with an SSL context other than server_tls()'s, reports no certificates
    app = AuthMiddleware(_never_called, _policy(pki, client_ca=True, token=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://test") as client:
        assert (await client.post(HOOK, json=DISCOVERY)).status_code == 401


@pytest.mark.anyio
async def test_no_policy_lets_everything_through(pki: dict[str, Path]) -> None:
    policy = _policy(pki, client_ca=False, token=False)
    assert not policy.enabled
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_app(policy)), base_url="https://t"
    ) as client:
        assert (await client.post(HOOK, json=DISCOVERY)).status_code == 200


def test_config_errors_are_precise(tmp_path: Path, pki: dict[str, Path]) -> None:
    short = tmp_path / "short"
    short.write_text("abc\n")
    two_words = tmp_path / "two"
    two_words.write_text("0123456789abcdef 0123456789abcdef\n")
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("hello\n")
    cases: list[tuple[Settings, str]] = [
        (Settings(bearer_token_file=tmp_path / "absent"), r"--bearer-token-file .*absent: cannot read it"),
        (Settings(bearer_token_file=short), "token must be at least 16 bytes"),
        (Settings(bearer_token_file=two_words), "token must be one word on one line"),
        (Settings(client_ca=not_pem), r"--client-ca .*ca.crt: cannot load it"),
        (Settings(client_ca=tmp_path / "none.crt"), r"--client-ca .*none.crt: cannot load it"),
        (Settings(client_ca=pki["ca"], plain_http=True), "cannot be combined with --plain-http"),
    ]
    for settings, message in cases:
        with pytest.raises(AuthConfigError, match=message):
            AuthPolicy.build(settings.client_ca, settings.bearer_token_file, settings.plain_http)
    with pytest.raises(AuthConfigError, match="cannot load it"):
        server_tls(pki["cert"], pki["key"], not_pem)


def test_the_real_app_wired_as_cli_should(pki: dict[str, Path], ca: trustme.CA) -> None:
    """create_app (with its AuthMiddleware) served with server_tls's uvicorn options, as cli/serve.py does."""
    from inplace_extension.app import create_app

    settings = Settings(
        tls_cert=pki["cert"], tls_key=pki["key"], client_ca=pki["ca"], bearer_token_file=pki["token"]
    )
    app = create_app(settings)
    assert settings.tls_cert is not None
    with _serve(app, server_tls(settings.tls_cert, settings.tls_key, settings.client_ca)) as url:
        with _client(ca) as anonymous:
            assert anonymous.post(url + HOOK, json=DISCOVERY).status_code == 401
            assert anonymous.get(url + "/metrics").status_code == 401
            assert anonymous.get(url + "/healthz").status_code == 200
            assert anonymous.get(url + "/readyz").status_code == 200
            with_token = anonymous.post(
                url + HOOK, json=DISCOVERY, headers={"authorization": f"Bearer {TOKEN}"}
            )
            assert with_token.status_code == 200
        with _client(ca, ca.issue_cert("capi")) as capi:
            answer = capi.post(url + HOOK, json=DISCOVERY)
            assert answer.status_code == 200
            assert answer.json()["status"] == "Success"
            assert {h["name"] for h in answer.json()["handlers"]} >= {"can-update-machine", "update-machine"}
            metrics = capi.get(url + "/metrics").text
            assert 'inplace_extension_hook_calls_total{hook="Discovery",status="Success"} 2.0' in metrics
