"""The lab's PKI, made with ``cryptography``: one CA per lab, serving and client certificates, the
service-account key pair. Everything is written as PEM files into the lab's ``pki/`` directory.

One CA signs everything (the apiserver's serving cert, the admin client cert, webhook and extension
serving certs added by flavours), so every component trusts the lab with one ``caBundle``. Keys are
EC P-256 (fast to make) except the service-account key, which is RSA as kube-apiserver's RS256
token signing expects.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)  # a lab lives for a test session; a month covers a long demo


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


class CertificateAuthority:
    """The lab CA in ``directory`` (made on first use, loaded afterwards)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_path = directory / "ca.crt"
        key_path = directory / "ca.key"
        if self.cert_path.is_file() and key_path.is_file():
            loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(loaded, ec.EllipticCurvePrivateKey):
                raise TypeError(f"{key_path}: not an EC key")
            self._key = loaded
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            return
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name("kubelab-ca")
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self._key, hashes.SHA256())
        )
        _write_key(key_path, self._key)
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    @property
    def pem(self) -> bytes:
        return self.cert_path.read_bytes()

    def _issue(
        self, name: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: tuple[str, ...]
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(s) for s in sans]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        _write_key(pair.key, key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair

    def issue_server(self, name: str, sans: tuple[str, ...] = ("127.0.0.1", "localhost")) -> KeyPair:
        """A serving certificate ``<name>.crt``/``.key`` for the given IP and DNS names."""
        return self._issue(name, _name(name), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, name: str, common_name: str, organizations: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate: Kubernetes reads the user from CN and the groups from O."""
        return self._issue(name, _name(common_name, organizations), ExtendedKeyUsageOID.CLIENT_AUTH, ())

    def service_account_keys(self) -> KeyPair:
        """The RSA key pair that signs and verifies service-account tokens (``sa.pub`` as the "cert")."""
        pair = KeyPair(self.directory / "sa.pub", self.directory / "sa.key")
        if pair.cert.is_file() and pair.key.is_file():
            return pair
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pair.key, key)
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return pair
