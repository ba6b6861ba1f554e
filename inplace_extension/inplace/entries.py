"""KubeadmConfig values turned into role inputs: users, ntp and kubelet arguments (files live in files.py).

Each parser either returns the role's input, raises EntrySkipped (the value is not ours to carry out, e.g. a
user whose password comes from a Secret) or EntryInvalid (malformed; names the key at fault). Messages
name keys and rules, never values: request data may be secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from inplace_extension.errors import LocatedError
from inplace_extension.inplace.pointers import MISSING, get_in, is_object

_USER_KEYS: Final[Mapping[str, str]] = {  # KubeadmConfig v1beta2 User JSON name -> users role input name
    "name": "name",
    "gecos": "gecos",
    "groups": "groups",
    "homeDir": "home_dir",
    "inactive": "inactive",
    "shell": "shell",
    "passwd": "passwd",
    "primaryGroup": "primary_group",
    "lockPassword": "lock_password",
    "sudo": "sudo",
    "sshAuthorizedKeys": "ssh_authorized_keys",
}
_USER_BOOLS: Final = frozenset({"inactive", "lockPassword"})
# The patterns below are the ones the roles assert (playbooks/roles/*/defaults/main.yml): a value the
# role would refuse must never be claimed, or the update would fail on the host after CAPI said yes.
USER_NAME: Final = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_USER_PATH: Final = re.compile(r"^/[^:\n\r]*$")  # home_dir, shell: absolute, no ':' (a passwd separator)
ARG_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# systemd splits KUBELET_EXTRA_ARGS on whitespace and a shell may source the file: no quoting is possible.
ARG_VALUE: Final = re.compile(r'^[^\s\x00-\x1f"\\$`]*$')
NTP_SERVER: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_KEY_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")

# cloud-init renders user data marked "## template: jinja" once, at bootstrap: Metal3 templates carry
# data-source values such as "metal3.io/uuid={{ ds.meta_data.uuid }}". Nothing renders them in place.
_TEMPLATE: Final = re.compile(r"\{\{|\{%")
TEMPLATE_PROBLEM: Final = (
    "holds a cloud-init template, which is rendered only at bootstrap; a changed templated value is not "
    "carried out in place"
)

JOIN_ARGS: Final = ("joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
INIT_ARGS: Final = ("initConfiguration", "nodeRegistration", "kubeletExtraArgs")


class EntrySkipped(Exception):
    """Not ours to carry out (needs a Secret, not text, unknown field): never claimed, left out of plans."""


class EntryInvalid(LocatedError):
    """Malformed value; ``where`` is the key at fault relative to the entry ("" for the entry itself)."""


def describe_key(key: object) -> str:
    """A key name for a message: quoted when it looks like a field name, otherwise not echoed at all."""
    return repr(key) if isinstance(key, str) and _KEY_NAME.match(key) else "an unexpected field"


def holds_template(value: Any) -> bool:
    """Whether any string in ``value`` (keys too, at any depth) holds a cloud-init Jinja template."""
    if isinstance(value, str):
        return _TEMPLATE.search(value) is not None
    if isinstance(value, dict):
        return any(holds_template(key) or holds_template(item) for key, item in value.items())
    if isinstance(value, list):
        return any(holds_template(item) for item in value)
    return False


def entries_of(value: Any) -> list[Any]:
    """A list field's entries; absence is an empty list. Raises EntryInvalid for a non-list."""
    if value is MISSING:
        return []
    if not isinstance(value, list):
        raise EntryInvalid("", "must be a list")
    return value


def parse_user(entry: Any) -> dict[str, Any]:
    """One ``users`` entry -> ``users_users`` item."""
    if not is_object(entry):
        raise EntryInvalid("", "must be an object")
    if "passwdFrom" in entry:
        raise EntrySkipped("uses passwdFrom, which needs access to a Secret")
    unknown = sorted(set(entry) - set(_USER_KEYS))
    if unknown:
        raise EntrySkipped(f"has field {describe_key(unknown[0])}, which the users role does not carry out")
    name = entry.get("name")
    if not isinstance(name, str) or not USER_NAME.match(name):
        raise EntryInvalid("name", "must be a POSIX user name (lower case, at most 32 characters)")
    result: dict[str, Any] = {"ssh_authorized_keys": []}
    for key, value in entry.items():
        result[_USER_KEYS[key]] = _user_value(key, value)
    return result


def _user_value(key: str, value: Any) -> Any:
    if key in _USER_BOOLS:
        if not isinstance(value, bool):
            raise EntryInvalid(key, "must be a boolean")
        return value
    if key == "sshAuthorizedKeys":
        if not isinstance(value, list) or not all(isinstance(k, str) and k for k in value):
            raise EntryInvalid(key, "must be a list of non-empty strings")
        if any(_CONTROL.search(k) for k in value):
            raise EntryInvalid(key, "must not contain line breaks or control characters")
        return list(value)  # a copy: plan inputs never alias the request
    if not isinstance(value, str):
        raise EntryInvalid(key, "must be a string")
    if _CONTROL.search(value):
        # These land in /etc/passwd, /etc/sudoers.d and the like, one record per line.
        raise EntryInvalid(key, "must not contain line breaks or control characters")
    if key == "groups":
        # v1beta2 carries groups as one comma-separated string (as cloud-init does); the role takes a list.
        groups = [group.strip() for group in value.split(",") if group.strip()]
        if not all(USER_NAME.match(group) for group in groups):
            raise EntryInvalid(key, "must be comma-separated POSIX group names")
        return groups
    if key == "primaryGroup" and not USER_NAME.match(value):
        raise EntryInvalid(key, "must be a POSIX group name")
    if key in ("homeDir", "shell") and (not _USER_PATH.match(value) or ".." in value.split("/")):
        raise EntryInvalid(key, "must be an absolute path without '..' or ':'")
    if key in ("gecos", "passwd") and ":" in value:
        raise EntryInvalid(key, "must not contain ':'")
    return value


def parse_kubelet_arg(entry: Any) -> dict[str, str]:
    """One v1beta2 ``kubeletExtraArgs`` item ``{name, value}`` -> ``kubelet_args_extra_args`` item."""
    if not is_object(entry):
        raise EntryInvalid("", "must be an object")
    unknown = sorted(set(entry) - {"name", "value"})
    if unknown:
        raise EntryInvalid(
            "", f"has field {describe_key(unknown[0])}, which a kubelet argument does not have"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not ARG_NAME.match(name):
        raise EntryInvalid("name", "must be a kubelet flag name (lower-case letters, digits, '-')")
    value = entry.get("value", "")
    if not isinstance(value, str):
        raise EntryInvalid("value", "must be a string")
    if not ARG_VALUE.match(value):
        raise EntryInvalid("value", "must not contain whitespace, line breaks, quotes, backslash, '$' or '`'")
    return {"name": name, "value": value}


# kubeadm writes kubeletExtraArgs into kubeadm-flags.env at join; the kubelet_args role adds its own
# KUBELET_EXTRA_ARGS after them. For plain flags the last value wins, but these flags accumulate across
# repetitions (k8s.io/component-base/cli/flag MapStringString/MapStringBool.Set and pflag slices), so
# the earlier value would keep some effect.
MERGING_MAP_FLAGS: Final = frozenset(
    {
        "node-labels",
        "feature-gates",
        "kube-reserved",
        "system-reserved",
        "qos-reserved",
        "cpu-manager-policy-options",
        "topology-manager-policy-options",
        "eviction-hard",
        "eviction-soft",
        "eviction-soft-grace-period",
        "eviction-minimum-reclaim",
    }
)
APPENDING_LIST_FLAGS: Final = frozenset(
    {"cluster-dns", "tls-cipher-suites", "allowed-unsafe-sysctls", "reserved-memory", "register-with-taints"}
)


def kubelet_arg_change_problem(name: str, before: str, after: str) -> str | None:
    """Why replacing one kubelet flag value by another is not what kubelet would end up with, or None."""
    if before == after:
        return None
    if name in APPENDING_LIST_FLAGS:
        return "changes a list-valued flag, and kubelet would keep the earlier items too"
    if name in MERGING_MAP_FLAGS and not _map_keys(before) <= _map_keys(after):
        return "drops a key of a map-valued flag, and kubelet would keep the earlier one"
    return None


def _map_keys(value: str) -> set[str]:
    # "a=1,b=2" or, for eviction thresholds, "memory.available<100Mi,nodefs.available<10%"
    return {re.split(r"[=<]", pair, maxsplit=1)[0].strip() for pair in value.split(",") if pair.strip()}


def effective_kubelet_args(spec: Any) -> tuple[tuple[str, ...] | None, Any]:
    """Where the node's kubelet arguments come from: joinConfiguration if it sets them, else init.

    Returns (spec-relative tokens, value); (None, MISSING) when neither sets them.
    """
    for tokens in (JOIN_ARGS, INIT_ARGS):
        value = get_in(spec, tokens)
        if value is not MISSING:
            return tokens, value
    return None, MISSING


def parse_ntp(value: Any) -> dict[str, Any]:
    """``ntp`` {servers, enabled} -> the ntp role's inputs. cloud-init enables NTP unless told otherwise."""
    if not is_object(value):
        raise EntryInvalid("", "must be an object")
    unknown = sorted(set(value) - {"servers", "enabled"})
    if unknown:
        raise EntrySkipped(f"has field {describe_key(unknown[0])}, which the ntp role does not carry out")
    servers = value.get("servers", [])
    if not isinstance(servers, list) or not all(isinstance(s, str) and s for s in servers):
        raise EntryInvalid("servers", "must be a list of non-empty strings")
    if not all(NTP_SERVER.match(server) for server in servers):
        raise EntryInvalid("servers", "must be host names or IP addresses")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise EntryInvalid("enabled", "must be a boolean")
    return {"ntp_enabled": enabled, "ntp_servers": list(servers)}
