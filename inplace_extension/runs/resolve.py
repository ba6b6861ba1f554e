"""Host resolution: the SSH target of a Machine, from its address annotation or the inventory, allow-listed.

Order: the Machine annotation ``inplace-extension.io/address`` gives the address (an IP literal); every
other SSH setting comes from the first inventory entry that matches the Machine, else the inventory
defaults. Without the annotation, the first matching entry gives the address too; without both, the
machine's ``status.addresses`` (the first IP literal of the preferred types, in that order): the live
Machine's in the Kubernetes-aware mode, the Node's for the MCM agent (which passes the Node's annotations
and labels in place of the Machine's, so the order and the Failures are the same). The address must be
inside ``--allowed-cidrs`` (nothing is allowed until configured), and host keys follow the same rules
whatever the source. Used by :mod:`runs.service`.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from inplace_extension.errors import ExtensionError
from inplace_extension.runs.inventory import HostDefaults, HostEntry, Inventory, parse_ip, parse_known_hosts

ADDRESS_ANNOTATION = "inplace-extension.io/address"
DEFAULT_ADDRESS_TYPES = ("InternalIP", "ExternalIP")


class ResolveError(ExtensionError):
    """No usable SSH target. ``reason`` is stable CamelCase; the message is deterministic and value-free."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason)


@dataclass(frozen=True)
class HostTarget:
    """Everything a run needs to reach one host."""

    address: str
    port: int
    user: str | None  # None: ssh's own default (the service's user)
    private_key_file: Path | None
    become: bool
    host_keys: tuple[str, ...]  # "<type> <base64>" pinned for ``address``; empty only when unchecked
    insecure_skip_host_key_check: bool
    python_interpreter: str | None
    source: str  # "annotation", "inventory" or "machine status"


def matches(entry: HostEntry, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
    m = entry.match
    if m.name is not None and not fnmatch.fnmatchcase(name, m.name):
        return False
    if m.namespace is not None and not fnmatch.fnmatchcase(namespace, m.namespace):
        return False
    return all(labels.get(key) == value for key, value in (m.labels or {}).items())


def parse_cidrs(cidrs: Sequence[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def resolve_host(
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    inventory: Inventory,
    allowed: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
    machine_addresses: Callable[[], Sequence[tuple[str, str]]] | None = None,
    address_types: Sequence[str] = DEFAULT_ADDRESS_TYPES,
) -> HostTarget:
    """Return the SSH target of the Machine or raise :class:`ResolveError`.

    ``machine_addresses`` reads the machine's ``status.addresses`` (the live Machine's in the
    Kubernetes-aware mode, the MCM agent's Node); it is called only when neither the annotation nor the
    inventory gives an address. None: there is no status to read (a plain ``serve``).
    """
    entry = next((e for e in inventory.hosts if matches(e, namespace, name, labels)), None)
    annotated = annotations.get(ADDRESS_ANNOTATION)
    if annotated is not None:
        try:
            address = parse_ip(annotated)
        except ValueError:
            raise ResolveError(
                "InvalidAddress", f"annotation {ADDRESS_ANNOTATION} is not an IP address literal"
            ) from None
        source = "annotation"
    elif entry is not None:
        address, source = entry.address, "inventory"
    else:
        found = None if machine_addresses is None else pick_address(machine_addresses(), address_types)
        if found is None:
            status = f", nor an {'/'.join(address_types)} address in its status" if machine_addresses else ""
            raise ResolveError(
                "HostNotFound",
                f"no inventory entry matches this Machine and it has no {ADDRESS_ANNOTATION} annotation"
                + status,
            )
        address, source = found, "machine status"
    ip = ipaddress.ip_address(address)
    if not any(ip in net for net in allowed):
        # the address is logged by the caller; the CAPI message only says where it came from
        raise ResolveError("HostNotAllowed", f"the address from the {source} is outside --allowed-cidrs")
    return _target(address, entry, inventory.defaults, source)


def status_addresses(
    carried: Sequence[tuple[str, str]] | None, live: Callable[[], Sequence[tuple[str, str]]] | None
) -> Callable[[], Sequence[tuple[str, str]]] | None:
    """Where :func:`resolve_host` reads a machine's ``status.addresses``: those its request carries (the
    MCM agent's Node), else ``live`` (the live Machine's, in the Kubernetes-aware mode), else nowhere.
    The service and ``plan`` both ask this."""
    if carried is not None:
        addresses = tuple(carried)
        return lambda: addresses
    return live


def pick_address(addresses: Sequence[tuple[str, str]], types: Sequence[str]) -> str | None:
    """The first IP literal of the first preferred type that has one (host names are never resolved)."""
    for wanted in types:
        for kind, address in addresses:
            if kind == wanted:
                try:
                    return parse_ip(address)
                except ValueError:
                    continue
    return None


def _target(address: str, entry: HostEntry | None, defaults: HostDefaults, source: str) -> HostTarget:
    def pick(field: str) -> object:
        value = getattr(entry, field) if entry is not None else None
        return getattr(defaults, field) if value is None else value

    # an entry's own host-key policy wins as a whole over the defaults' policy
    if entry is not None and (
        entry.known_hosts is not None or entry.insecure_skip_host_key_check is not None
    ):
        known, insecure = entry.known_hosts, bool(entry.insecure_skip_host_key_check)
    else:
        known, insecure = defaults.known_hosts, bool(defaults.insecure_skip_host_key_check)
    if not insecure and known is None:
        raise ResolveError(
            "NoHostKey",
            "the inventory gives no known_hosts for this host and does not set insecure_skip_host_key_check",
        )
    port, user, key, become, interp = (
        pick(f) for f in ("port", "user", "private_key_file", "become", "python_interpreter")
    )
    return HostTarget(
        address=address,
        port=port if isinstance(port, int) else 22,
        user=user if isinstance(user, str) else None,
        private_key_file=key if isinstance(key, Path) else None,
        become=become if isinstance(become, bool) else True,
        host_keys=() if insecure or known is None else parse_known_hosts(known),
        insecure_skip_host_key_check=insecure,
        python_interpreter=interp if isinstance(interp, str) else None,
        source=source,
    )
