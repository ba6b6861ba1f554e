"""Who may call: client certificates (``--client-ca``) and a bearer token (``--bearer-token-file``).

Used by ``cli/serve.py`` (TLS settings for uvicorn: :func:`server_tls`, whose SSL context reports each
connection's verified client certificate) and by ``app.py`` (:class:`AuthMiddleware`, outermost). The
policy, for every path except the probe paths:

==========  =============  ===================================================================
client CA   bearer token   a request is let through when ...
==========  =============  ===================================================================
no          no             always (TLS only authenticates the server)
yes         no             the TLS connection carries a client certificate signed by the CA
no          yes            ``Authorization: Bearer <token>`` matches
yes         yes            either of the two (CAPI presents a certificate, people use the token)
==========  =============  ===================================================================

With a client CA the TLS layer asks for a certificate but does not demand one (``CERT_OPTIONAL``): a
certificate that does not chain to the CA fails the handshake, while a connection without one completes
and is answered 401 here. Demanding it in the handshake would break kubelet's HTTPS probes and the image's
HEALTHCHECK, which present none. CAPI itself can send no token (it sets no headers, docs/capi-hooks.md §1.2),
so the token is for other callers; CAPI sends a certificate only when its managers run with
``--runtime-extension-client-cert-file`` (docs/capi-hooks.md §1.3).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

PROBE_PATHS: Final = frozenset({"/healthz", "/readyz"})
"""Paths answered without credentials: kubelet probes and the image HEALTHCHECK cannot present any."""

NOT_REPORTED: Final = "not reported"
PEER_CERTIFICATE: ContextVar[dict[str, Any] | str | None] = ContextVar(
    "inplace_extension_peer_certificate", default=NOT_REPORTED
)
"""The TLS connection's verified client certificate (``SSLObject.getpeercert()``), ``None`` when it
presented none, or :data:`NOT_REPORTED` when the server's SSL context is not :func:`server_tls`'s.

Set by :class:`PeerCertificateReporter` when the handshake completes. asyncio runs every read of a
connection in one ``contextvars.Context`` of its own, and uvicorn starts each request's task in a copy of
it (unless ``reset_contextvars``), so a request sees the certificate of its own connection and no other.
"""

MIN_TOKEN_BYTES: Final = 16
_UNAUTHORIZED_BODY: Final = json.dumps(
    {"error": "Unauthorized", "message": "a client certificate or a bearer token is required"}
).encode()


class AuthConfigError(ValueError):
    """The auth settings cannot work (unreadable CA or token file, token too short, mTLS without TLS)."""


class PeerCertificateReporter(ssl.SSLObject):
    """The TLS connection object of :func:`server_tls`'s contexts (``SSLContext.sslobject_class``): when
    the handshake completes, the verified client certificate goes into :data:`PEER_CERTIFICATE`."""

    def do_handshake(self) -> None:
        super().do_handshake()  # raises until the handshake is complete (SSLWantReadError)
        # An empty dict means "presented nothing"; with CERT_OPTIONAL a bad certificate never gets here.
        PEER_CERTIFICATE.set(self.getpeercert() or None)


def report_peer_certificates(config: object, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn's ``ssl_context_factory``: its context from the ``ssl_*`` settings, reporting client
    certificates through :class:`PeerCertificateReporter`."""
    context = default()
    context.sslobject_class = PeerCertificateReporter
    return context


@dataclass(frozen=True)
class ServerTls:
    """The TLS keyword arguments for ``uvicorn.Config`` (:meth:`uvicorn_options`)."""

    certfile: str
    keyfile: str | None
    ca_certs: str | None
    cert_reqs: ssl.VerifyMode

    def uvicorn_options(self) -> dict[str, Any]:
        return {
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_ca_certs": self.ca_certs,
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_context_factory": report_peer_certificates,
        }


def server_tls(certfile: Path, keyfile: Path | None, client_ca: Path | None) -> ServerTls:
    """TLS settings for serving ``certfile``; with ``client_ca``, client certificates are verified."""
    if client_ca is None:
        return ServerTls(str(certfile), _opt_str(keyfile), None, ssl.CERT_NONE)
    _check_ca_file(client_ca)
    return ServerTls(str(certfile), _opt_str(keyfile), str(client_ca), ssl.CERT_OPTIONAL)


@dataclass(frozen=True)
class AuthPolicy:
    """What :class:`AuthMiddleware` demands. Build it with :meth:`build`."""

    client_ca: bool
    token_digest: bytes | None  # sha256 of the token; compared in constant time, never logged
    open_paths: frozenset[str] = PROBE_PATHS

    @classmethod
    def build(
        cls,
        client_ca: Path | None,
        bearer_token_file: Path | None,
        plain_http: bool,
        open_paths: Iterable[str] = PROBE_PATHS,
    ) -> AuthPolicy:
        """Policy from Settings ``client_ca``, ``bearer_token_file``, ``plain_http``; reads the files now."""
        if client_ca is not None and plain_http:
            raise AuthConfigError("--client-ca needs TLS; it cannot be combined with --plain-http")
        if client_ca is not None:
            _check_ca_file(client_ca)
        digest = None
        if bearer_token_file is not None:
            digest = hashlib.sha256(read_token(bearer_token_file)).digest()
            if client_ca is None:
                log.warning(
                    "auth: bearer token without --client-ca: CAPI cannot send a token, its calls get 401"
                )
        return cls(client_ca=client_ca is not None, token_digest=digest, open_paths=frozenset(open_paths))

    @property
    def enabled(self) -> bool:
        return self.client_ca or self.token_digest is not None


def read_token(path: Path) -> bytes:
    """The token in ``path`` (one line; surrounding whitespace, e.g. the newline of a Secret, removed)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise AuthConfigError(f"--bearer-token-file {path}: cannot read it ({exc.strerror})") from exc
    token = raw.strip()
    if len(token) < MIN_TOKEN_BYTES:
        raise AuthConfigError(f"--bearer-token-file {path}: token must be at least {MIN_TOKEN_BYTES} bytes")
    if b"\n" in token or b" " in token:
        raise AuthConfigError(f"--bearer-token-file {path}: token must be one word on one line")
    return token


class AuthMiddleware:
    """ASGI middleware enforcing an :class:`AuthPolicy`; refusals are 401 with a fixed body.

    Add it outermost, so nothing reads a body before the caller is known:
    ``Starlette(..., middleware=[Middleware(AuthMiddleware, policy=policy), ...])``.
    """

    def __init__(self, app: ASGIApp, policy: AuthPolicy) -> None:
        self.app = app
        self.policy = policy
        self._warned_no_peer_info = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.policy.enabled or scope["path"] in self.policy.open_paths:
            await self.app(scope, receive, send)
            return
        reason = self._refusal(scope)
        if reason is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        # One line per refusal; never the token or any header value. The path is capped: it is caller data.
        log.info(
            "auth: refused method=%s path=%.120r client=%s reason=%s",
            scope["method"],
            scope["path"],
            client[0] if client else "-",
            reason,
        )
        await _send_unauthorized(send, bearer=self.policy.token_digest is not None)

    def _refusal(self, scope: Scope) -> str | None:
        """None when the request may pass, else a fixed reason word for the log."""
        if self.policy.client_ca:
            peer = PEER_CERTIFICATE.get()
            if peer == NOT_REPORTED:
                # Fail closed: the server's SSL context is not server_tls()'s, so we cannot tell.
                if not self._warned_no_peer_info:
                    self._warned_no_peer_info = True
                    log.error("auth: --client-ca is set but the server does not report client certificates")
            elif peer:
                return None
        if self.policy.token_digest is not None:
            presented = _bearer_token(scope)
            if presented is None:
                return "no-credentials"
            if hmac.compare_digest(hashlib.sha256(presented).digest(), self.policy.token_digest):
                return None
            return "bad-token"
        return "no-client-certificate"


def _bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return bytes(token.strip())
            return None
    return None


async def _send_unauthorized(send: Send, bearer: bool) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_UNAUTHORIZED_BODY)).encode()),
    ]
    if bearer:
        headers.append((b"www-authenticate", b'Bearer realm="inplace-extension"'))
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": _UNAUTHORIZED_BODY})


def _check_ca_file(path: Path) -> None:
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not PEM CA certificates"
        raise AuthConfigError(f"--client-ca {path}: cannot load it ({detail})") from exc


def _opt_str(path: Path | None) -> str | None:
    return None if path is None else str(path)
