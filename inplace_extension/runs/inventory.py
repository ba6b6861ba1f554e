"""The inventory file (``--inventory``): which SSH target serves which Machine. Model, loading, errors.

Read by :mod:`runs.resolve`; its JSON Schema (``schemas/inventory.schema.json``) is generated
from :class:`Inventory`. Addresses must be IP literals: the allow-list is checked on exactly the address
SSH will use, with no DNS lookup in between that could answer differently later.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inplace_extension.yamlfile import load_model, parse_model

log = logging.getLogger(__name__)

KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


class InventoryError(ValueError):
    """The inventory file is missing, not YAML, or does not match the schema. The message says where."""


def parse_ip(value: str) -> str:
    """Return the canonical text of an IP literal, or raise ValueError (host names are refused on purpose)."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError("must be an IPv4 or IPv6 address literal, not a host name") from None


def parse_known_hosts(text: str) -> tuple[str, ...]:
    """Reduce known_hosts text to its ``<key-type> <base64>`` pairs; host patterns and comments are dropped.

    The key is pinned to the address the run connects to (resolve.py writes it with that address), so a
    host pattern in the entry that says otherwise must not decide which key is trusted.
    """
    keys: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if fields[0].startswith("@"):
            raise ValueError("markers such as @cert-authority or @revoked are not supported")
        if fields[0] not in KEY_TYPES:
            fields = fields[1:]  # drop the host pattern column
        if len(fields) < 2 or fields[0] not in KEY_TYPES:
            raise ValueError(
                f"each line must be '[host] <key-type> <base64-key>' with key type in {KEY_TYPES}"
            )
        keys.append(f"{fields[0]} {fields[1]}")
    if not keys:
        raise ValueError("holds no host key")
    return tuple(keys)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    """Which Machines an entry serves. Every given criterion must hold; at least one is required."""

    name: str | None = Field(None, description="Machine name or shell-style glob (md-0-*)")
    namespace: str | None = Field(None, description="Machine namespace or glob; any namespace when absent")
    labels: dict[str, str] | None = Field(None, description="labels the Machine must carry (all of them)")

    @model_validator(mode="after")
    def _some_criterion(self) -> Match:
        if self.name is None and not self.labels:
            raise ValueError("match needs 'name' or 'labels'")
        return self


class _SshSettings(_Strict):
    port: int | None = Field(None, ge=1, le=65535, description="SSH port (22 when unset everywhere)")
    user: str | None = Field(None, min_length=1, description="SSH login user")
    private_key_file: Path | None = Field(None, description="absolute path of the SSH private key")
    become: bool | None = Field(None, description="use sudo on the host (true when unset everywhere)")
    known_hosts: str | None = Field(
        None, description="known_hosts line(s) of the host key, '[host] <type> <base64>'; pinned"
    )
    insecure_skip_host_key_check: bool | None = Field(
        None, description="do not verify the SSH host key (labs only)"
    )
    python_interpreter: str | None = Field(None, description="ansible_python_interpreter on the host")

    @field_validator("private_key_file")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("known_hosts")
    @classmethod
    def _known_hosts(cls, value: str | None) -> str | None:
        if value is not None:
            parse_known_hosts(value)
        return value

    @model_validator(mode="after")
    def _one_host_key_policy(self) -> _SshSettings:
        if self.known_hosts is not None and self.insecure_skip_host_key_check:
            raise ValueError("give either known_hosts or insecure_skip_host_key_check: true, not both")
        return self


class HostDefaults(_SshSettings):
    """Settings for every entry that does not set them, and for addresses given by Machine annotation."""


class HostEntry(_SshSettings):
    """One SSH target and the Machines it serves. The first entry that matches a Machine wins."""

    match: Match
    address: str = Field(description="IP address literal of the host")

    @field_validator("address")
    @classmethod
    def _ip(cls, value: str) -> str:
        return parse_ip(value)


class Inventory(_Strict):
    """The ``--inventory`` file: ordered host entries plus optional defaults."""

    hosts: list[HostEntry] = Field(default_factory=list)
    defaults: HostDefaults = Field(default_factory=HostDefaults)


def load_inventory(path: Path) -> Inventory:
    """Read and validate an inventory file; errors name the file, the line and the field."""
    return load_model(path, Inventory, f"inventory {path}", InventoryError)


def parse_inventory(text: str, source: str = "<inventory>") -> Inventory:
    return parse_model(text, Inventory, f"inventory {source}", InventoryError)[0]


class InventorySource:
    """The inventory file, read at start-up and again whenever its mtime changes."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._inventory = Inventory()
        if path is not None:
            self._inventory = load_inventory(path)  # a bad file at start-up stops the service
            self._mtime = path.stat().st_mtime

    def current(self) -> Inventory:
        if self._path is None:
            return self._inventory
        try:
            mtime = self._path.stat().st_mtime
        except OSError as exc:
            log.error("inventory %s: cannot stat (%s); keeping the last good one", self._path, exc)
            return self._inventory
        with self._lock:
            if mtime != self._mtime:
                try:
                    self._inventory = load_inventory(self._path)
                    log.info("inventory %s reloaded: %d entries", self._path, len(self._inventory.hosts))
                except InventoryError as exc:
                    log.error("%s; keeping the last good one", exc)
                self._mtime = mtime
            return self._inventory
