"""``serve``'s TLS files: the serving certificate and key checked before the service starts
(:func:`check_serving_files`), and development TLS for ``serve --self-signed``: a local CA and a serving
certificate signed by it.

The CA file is what a client (``call --cacert``) or an ExtensionConfig ``caBundle`` trusts; the files
are reused across restarts while they are valid and cover the requested host names.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=90)
RENEW_BEFORE = datetime.timedelta(days=7)


class TlsFileError(ValueError):
    """A serving certificate or key that cannot be served: the message names the file as it was given."""


def _read(path: Path, given: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsFileError(f"{given}: cannot read it ({exc.strerror or exc})") from None


def check_serving_files(cert: Path, key: Path, cert_given: str, key_given: str) -> None:
    """Load the serving certificate (chain) and its key as the server will, so that a bad file stops the
    start before anything is served; ``cert_given``/``key_given`` name each file as the user gave it
    (``--tls-cert /x``, ``INPLACE_TLS_KEY=/y``). Key material never appears in a message."""
    cert_pem, key_pem = _read(cert, cert_given), _read(key, key_given)
    try:
        x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TlsFileError(f"{cert_given}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    try:
        serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TlsFileError(f"{key_given}: the key is encrypted; serve needs it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsFileError(f"{key_given}: holds no PEM private key (-----BEGIN PRIVATE KEY-----)") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TlsFileError(
            f"{key_given} is not the key of {cert_given} ({exc.reason or 'the pair does not load'})"
        ) from None


@dataclass(frozen=True)
class DevCertificate:
    ca_cert: Path  # trust this (PEM); also the ExtensionConfig caBundle for a dev cluster
    cert: Path  # serving certificate (PEM)
    key: Path  # its private key (PEM, mode 0600)


def default_hosts(listen_host: str) -> list[str]:
    """Names the dev certificate covers: loopback always, plus the listen address when it is a real one."""
    hosts = ["localhost", "127.0.0.1", "::1"]
    if listen_host not in ("", "0.0.0.0", "::") and listen_host not in hosts:  # noqa: S104 -- a comparison
        hosts.append(listen_host)
    return hosts


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _is_usable(paths: DevCertificate, hosts: Sequence[str]) -> bool:
    if not all(path.is_file() for path in (paths.ca_cert, paths.cert, paths.key)):
        return False
    try:
        cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        covered = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    fresh = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > RENEW_BEFORE
    return fresh and all(name in covered for name in _san(hosts))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def ensure_dev_certificate(directory: Path, hosts: Sequence[str]) -> tuple[DevCertificate, bool]:
    """The dev CA + serving certificate in ``directory``; returns (paths, whether they were just created)."""
    paths = DevCertificate(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if _is_usable(paths, hosts):
        return paths, False
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inplace-extension development CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    # the CA key is thrown away: this CA signs exactly one certificate
    paths.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        paths.key,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return paths, True
