"""Host resolution: annotation first, then the first matching inventory entry; allow-list always."""

from __future__ import annotations

from pathlib import Path

import pytest

from inplace_extension.runs.inventory import parse_inventory
from inplace_extension.runs.resolve import (
    ADDRESS_ANNOTATION,
    HostTarget,
    ResolveError,
    parse_cidrs,
    resolve_host,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJAm/+qD5i6Qm8kDm+Qr9ygOJL1jDRtSlh6jlxmhLn0T"
INV = parse_inventory(
    f"""\
hosts:
  - match: {{name: "cp-1"}}
    address: 10.1.0.1
    user: admin
    known_hosts: "10.1.0.1 {KEY}"
  - match: {{name: "md-0-*", namespace: "prod"}}
    address: 10.1.0.2
    port: 2200
    insecure_skip_host_key_check: true
  - match: {{labels: {{pool: gpu}}}}
    address: 10.1.0.3
  - match: {{name: "md-0-*"}}
    address: 10.9.0.9
defaults: {{user: ops, private_key_file: /keys/id, become: false, known_hosts: "{KEY}"}}
"""
)
ALL = parse_cidrs(["10.1.0.0/24", "10.2.0.0/16"])


def resolve(
    name: str,
    ns: str = "prod",
    labels: dict[str, str] | None = None,
    ann: dict[str, str] | None = None,
    allowed: list[str] | None = None,
) -> HostTarget:
    cidrs = ALL if allowed is None else parse_cidrs(allowed)
    return resolve_host(ns, name, labels or {}, ann or {}, INV, cidrs)


def test_name_match_takes_entry_settings_over_defaults() -> None:
    t = resolve("cp-1")
    assert (t.address, t.port, t.user, t.become, t.source) == ("10.1.0.1", 22, "admin", False, "inventory")
    assert t.private_key_file == Path("/keys/id")
    assert t.host_keys == (KEY,)
    assert not t.insecure_skip_host_key_check


def test_glob_with_namespace_and_first_match_wins() -> None:
    t = resolve("md-0-abcde", ns="prod")
    assert (t.address, t.port, t.insecure_skip_host_key_check, t.host_keys) == ("10.1.0.2", 2200, True, ())
    # in another namespace the namespaced entry does not match; the later glob does (and is not allowed)
    with pytest.raises(ResolveError) as err:
        resolve("md-0-abcde", ns="dev")
    assert err.value.reason == "HostNotAllowed"


def test_labels_match() -> None:
    assert resolve("x", labels={"pool": "gpu", "other": "1"}).address == "10.1.0.3"


def test_annotation_address_wins_and_uses_entry_or_defaults() -> None:
    t = resolve("cp-1", ann={ADDRESS_ANNOTATION: "10.2.3.4"})
    assert (t.address, t.user, t.source) == ("10.2.3.4", "admin", "annotation")
    t = resolve("unknown", ann={ADDRESS_ANNOTATION: " 10.2.3.5 "})
    assert (t.address, t.user, t.port, t.host_keys) == ("10.2.3.5", "ops", 22, (KEY,))


def test_annotation_must_be_an_ip_literal() -> None:
    with pytest.raises(ResolveError) as err:
        resolve("cp-1", ann={ADDRESS_ANNOTATION: "evil.example.com"})
    assert err.value.reason == "InvalidAddress"
    assert "evil" not in str(err.value)


def test_allow_list_is_checked_and_empty_allows_nothing() -> None:
    with pytest.raises(ResolveError) as err:
        resolve("cp-1", ann={ADDRESS_ANNOTATION: "192.168.9.9"})
    assert err.value.reason == "HostNotAllowed"
    assert "192.168" not in str(err.value)
    with pytest.raises(ResolveError, match="HostNotAllowed"):
        resolve("cp-1", allowed=[])


def test_no_match_and_no_annotation() -> None:
    with pytest.raises(ResolveError, match="HostNotFound"):
        resolve("nothing-here")


def test_no_host_key_policy_is_refused() -> None:
    inv = parse_inventory("hosts:\n  - match: {name: a}\n    address: 10.1.0.7\n")
    with pytest.raises(ResolveError, match="NoHostKey"):
        resolve_host("ns", "a", {}, {}, inv, ALL)
