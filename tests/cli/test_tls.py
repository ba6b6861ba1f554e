"""The --self-signed development CA and certificate."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509

from inplace_extension.tls import default_hosts, ensure_dev_certificate


def test_dev_certificate_covers_the_hosts_and_is_reused(tmp_path: Path) -> None:
    hosts = [*default_hosts("10.1.2.3"), "inplace-py-svc.inplace-py-system.svc"]
    paths, created = ensure_dev_certificate(tmp_path / "tls", hosts)
    assert created
    cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "inplace-py-svc.inplace-py-system.svc" in san.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("10.1.2.3") in san.get_values_for_type(x509.IPAddress)
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600

    again, created_again = ensure_dev_certificate(tmp_path / "tls", hosts)
    assert (again, created_again) == (paths, False)
    _, regenerated = ensure_dev_certificate(tmp_path / "tls", [*hosts, "other.example"])
    assert regenerated  # a new name is not covered: a new certificate


def test_default_hosts_skip_wildcard_addresses() -> None:
    wildcard = "0.0.0.0"  # noqa: S104 -- a value under test, nothing binds here
    assert default_hosts(wildcard) == ["localhost", "127.0.0.1", "::1"]
