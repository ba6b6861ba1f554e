"""Shipped capabilities: built-in roles fed by a field the user maps in the capabilities file.

``os_update`` runs an OS update command (GEP-31 ``osUpdate.command`` + ``args``) when the mapped field
(e.g. ``Metal3Machine /image/url``) changes; ``kubelet_credentials`` rotates the kubelet's client
credentials when a Machine annotation carries a new rotation timestamp. Their roles ship in
``playbooks/roles``; the capabilities file says which field feeds them and how they run (command,
arguments, outcome classification), so each is a :class:`CustomCapability` with a :class:`ValueRule`
(here) that guards the claimed value and turns it into the role's ``<name>_settings``. Pure.

Request values only ever become whole ``argv`` items (``{target}``/``{version}`` in ``args``): never a
shell, never templated (the settings reach the role through the inputs file, like every input).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

OS_UPDATE: Final = "os_update"
KUBELET_CREDENTIALS: Final = "kubelet_credentials"
SHIPPED: Final = (OS_UPDATE, KUBELET_CREDENTIALS)
TARGET, VERSION = "{target}", "{version}"

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# RFC 3339, as kubectl annotate ... "$(date -u +%Y-%m-%dT%H:%M:%SZ)" writes it
TIMESTAMP: Final = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
NEVER: Final = "(?!)"  # a regex that matches nothing: no patterns configured


def _only(values: Mapping[str, Any]) -> Any:
    [value] = values.values()  # the loader gives each shipped capability exactly one claim
    return value


@dataclass(frozen=True)
class OsUpdateRule:
    """``os_update`` from the capabilities file; see docs/capabilities.md."""

    command: str
    args: tuple[str, ...]
    version_pattern: str | None  # searched in the target; group "version" (else the whole match)
    version_command: tuple[str, ...]
    retriable_exit_codes: tuple[int, ...] = ()
    retriable_patterns: tuple[str, ...] = ()
    terminal_patterns: tuple[str, ...] = ()
    retries: int = 2
    retry_delay_seconds: int = 10
    reboot_exit_code: int | None = None
    reboot_marker_file: str | None = None
    reboot_timeout_seconds: int = 600

    def version(self, target: str) -> str | None:
        if self.version_pattern is None:
            return target
        match = re.search(self.version_pattern, target)
        if match is None:
            return None
        version = match.groupdict().get("version") or match.group(0)
        return version or None

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or not value or _CONTROL.search(value):
            return "must be a non-empty one-line string to feed the OS update command"
        if self.version(value) is None:
            return "holds no OS version (os_update.version_pattern in the capabilities file finds none)"
        return None

    def settings(self, values: Mapping[str, Any]) -> dict[str, Any]:
        target = _only(values)
        version = self.version(target)
        substitutes = {TARGET: target, VERSION: version}
        return {
            "argv": [self.command, *(substitutes.get(arg, arg) for arg in self.args)],
            "version": version,
            "version_command": list(self.version_command),
            "done_exit_codes": [0] if self.reboot_exit_code is None else [0, self.reboot_exit_code],
            "retriable_exit_codes": list(self.retriable_exit_codes),
            "retriable_regex": "|".join(f"(?:{p})" for p in self.retriable_patterns) or NEVER,
            "terminal_regex": "|".join(f"(?:{p})" for p in self.terminal_patterns) or NEVER,
            "retries": self.retries,
            "retry_delay_seconds": self.retry_delay_seconds,
            "reboot_exit_code": self.reboot_exit_code,
            "reboot_marker_file": self.reboot_marker_file,
            "reboot_timeout_seconds": self.reboot_timeout_seconds,
        }


@dataclass(frozen=True)
class KubeletCredentialsRule:
    """``kubelet_credentials`` from the capabilities file; see docs/capabilities.md."""

    kubeconfig: str = "/etc/kubernetes/kubelet.conf"
    bootstrap_kubeconfig: str = "/etc/kubernetes/bootstrap-kubelet.conf"
    cert_dir: str = "/var/lib/kubelet/pki"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or not TIMESTAMP.match(value):
            return "must be an RFC 3339 timestamp (the time the rotation was asked for)"
        return None

    def settings(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "rotation": _only(values),
            "kubeconfig": self.kubeconfig,
            "bootstrap_kubeconfig": self.bootstrap_kubeconfig,
            "cert_dir": self.cert_dir,
        }
