"""CAPABILITIES: the one table of what can change in place, which role does it, and what inputs it gets.

A capability = name (= role name = Ansible tag) + claims (spec-relative JSON pointers per object kind, each
with a guard) + role inputs (declared types and the extractor that reads them from the desired objects).
Pointers are relative to the machine spec, so one declaration serves Machine ``/spec``, MachineSet
``/spec/template/spec``, KubeadmConfig ``/spec`` and KubeadmConfigTemplate ``/spec/template/spec``.
The table order is the run order of the roles in ``playbooks/update_machine.yml`` (architecture.md):
accounts and time first, files before the kubelet flags that may reference them, the Kubernetes
upgrade (which restarts everything) last.

Each capability also declares its disruption class (:class:`Disruption`): what carrying it out does to
the node. It is the one place three features read: the drain before the first step of class
``restart-kubelet`` or above, ``affectsAvailability`` in the CanUpdate* answers, and the
``skip-remediation`` annotation while a disruptive step runs. User-defined capabilities declare theirs
in the capabilities file (:mod:`inplace_extension.inplace.custom`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from inplace_extension.inplace import guards
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable, Disruption
from inplace_extension.inplace.entries import INIT_ARGS, JOIN_ARGS
from inplace_extension.inplace.infra_tags import CAPABILITY as INFRA_TAGS
from inplace_extension.inplace.inputs import (
    DesiredObjects,
    InputSpec,
    extract_kubeadm_files,
    extract_kubelet_args,
    extract_kubernetes_version,
    extract_ntp,
    extract_users,
)
from inplace_extension.inplace.objects import ClaimKind
from inplace_extension.inplace.pointers import join_pointer, parse_pointer

Extractor = Callable[[DesiredObjects], dict[str, Any] | None]


@dataclass(frozen=True)
class Claim:
    kind: ClaimKind
    pointer: str  # relative to the machine spec, e.g. "/files"
    guard: guards.Guard
    tokens: tuple[str, ...] = field(init=False, repr=False, compare=False)  # the pointer, parsed once

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", parse_pointer(self.pointer))


@dataclass(frozen=True)
class Capability:
    name: str
    claims: tuple[Claim, ...]
    inputs: Mapping[str, InputSpec]  # role variable name -> declared type; what argument_specs must list
    extract: Extractor  # desired objects -> role inputs, or None when the capability does not apply
    disruption: Disruption  # what carrying it out does to the node (drain, affectsAvailability, MHC)
    _by_kind: Mapping[ClaimKind, tuple[Claim, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_kind = {kind: tuple(claim for claim in self.claims if claim.kind is kind) for kind in ClaimKind}
        object.__setattr__(self, "_by_kind", by_kind)

    def claims_for(self, kind: ClaimKind) -> tuple[Claim, ...]:
        return self._by_kind[kind]


_STR = InputSpec("str")
_BOOL = InputSpec("bool")

_USER_OPTIONS: Final = {
    "name": InputSpec("str", required=True),
    "gecos": _STR,
    "groups": InputSpec("list", elements="str"),  # KubeadmConfig's comma-separated string, split
    "home_dir": _STR,
    "inactive": _BOOL,
    "shell": _STR,
    "passwd": InputSpec("str", no_log=True),  # a password hash, still sensitive
    "primary_group": _STR,
    "lock_password": _BOOL,
    "sudo": _STR,
    "ssh_authorized_keys": InputSpec("list", required=True, elements="str"),
}
# The plan always fills owner, permissions and append (cloud-init's defaults); the role has the same defaults.
_FILE_OPTIONS: Final = {
    "path": InputSpec("str", required=True),
    "content": InputSpec("str", required=True, no_log=True),  # files may hold credentials
    "owner": _STR,
    "permissions": _STR,
    "append": _BOOL,
}
_ARG_OPTIONS: Final = {"name": InputSpec("str", required=True), "value": InputSpec("str", required=True)}

_CLUSTER_CONFIGURATION_WITH_UPGRADE: Final = (
    "/clusterConfiguration/etcd/local/imageTag",
    "/clusterConfiguration/featureGates",
    "/clusterConfiguration/imageRepository",
    "/clusterConfiguration/dns/imageTag",
)

CAPABILITIES: Final[tuple[Capability, ...]] = (
    Capability(
        name="users",
        claims=(Claim(ClaimKind.KUBEADM_CONFIG, "/users", guards.users),),
        inputs={"users_users": InputSpec("list", required=True, elements="dict", options=_USER_OPTIONS)},
        extract=extract_users,
        disruption=Disruption.NONE,
    ),
    Capability(
        name="ntp",
        claims=(Claim(ClaimKind.KUBEADM_CONFIG, "/ntp", guards.ntp),),
        inputs={
            "ntp_enabled": InputSpec("bool", required=True),
            "ntp_servers": InputSpec("list", required=True, elements="str"),
        },
        extract=extract_ntp,
        disruption=Disruption.NONE,
    ),
    Capability(
        name="kubeadm_files",
        claims=(Claim(ClaimKind.KUBEADM_CONFIG, "/files", guards.kubeadm_files),),
        inputs={
            "kubeadm_files_files": InputSpec("list", required=True, elements="dict", options=_FILE_OPTIONS)
        },
        extract=extract_kubeadm_files,
        disruption=Disruption.NONE,
    ),
    Capability(
        name="kubelet_args",
        claims=(
            Claim(ClaimKind.KUBEADM_CONFIG, join_pointer(JOIN_ARGS), guards.kubelet_args),
            Claim(ClaimKind.KUBEADM_CONFIG, join_pointer(INIT_ARGS), guards.kubelet_args),
        ),
        inputs={
            "kubelet_args_extra_args": InputSpec("list", required=True, elements="dict", options=_ARG_OPTIONS)
        },
        extract=extract_kubelet_args,
        disruption=Disruption.RESTART_KUBELET,
    ),
    Capability(
        name="kubernetes_version",
        claims=(
            Claim(ClaimKind.MACHINE, "/version", guards.kubernetes_upgrade),
            *(
                Claim(ClaimKind.KUBEADM_CONFIG, p, guards.with_version_upgrade)
                for p in _CLUSTER_CONFIGURATION_WITH_UPGRADE
            ),
        ),
        inputs={
            "kubernetes_version_target": InputSpec("str", required=True),
            "kubernetes_version_control_plane": InputSpec("bool", required=True),
        },
        extract=extract_kubernetes_version,
        disruption=Disruption.RESTART_KUBELET,
    ),
)

# The claim whose verdict the clusterConfiguration claims depend on (see guards.with_version_upgrade).
VERSION_CLAIM: Final = CAPABILITIES[-1].claims[0]


def capability_names() -> tuple[str, ...]:
    return tuple(capability.name for capability in CAPABILITIES)


# the infrastructure tags (inplace/infra_tags.py) are no host work at all: the provider applies them
_BUILTIN_DISRUPTION: Final = {
    INFRA_TAGS: Disruption.NONE,
    **{capability.name: capability.disruption for capability in CAPABILITIES},
}


def disruption_of(name: str, custom: CustomTable = NO_CUSTOM) -> Disruption:
    """The class of one capability, built-in or user-defined; an unknown name is a bug (KeyError)."""
    builtin = _BUILTIN_DISRUPTION.get(name)
    return builtin if builtin is not None else custom.disruption_of(name)


def max_disruption(names: Iterable[str], custom: CustomTable = NO_CUSTOM) -> Disruption:
    """The highest class among ``names`` (``none`` for no names)."""
    return max((disruption_of(name, custom) for name in names), default=Disruption.NONE)


def first_disruptive(
    names: Iterable[str], custom: CustomTable = NO_CUSTOM, at_least: Disruption = Disruption.RESTART_KUBELET
) -> str | None:
    """The first capability (in run order) whose class is ``at_least`` or above: the node is drained
    before it runs."""
    return next((name for name in names if disruption_of(name, custom) >= at_least), None)


def drain_point(
    steps: Sequence[str], mode: str, custom: CustomTable = NO_CUSTOM, idle: Collection[str] = ()
) -> str | None:
    """The step right before which the Node is drained (the Kubernetes-aware mode's ``--drain``), or
    None: ``never``; ``always``: the first step; ``auto``: the first step whose class disrupts the node,
    not counting the ``idle`` steps (found to change nothing on this host this time). The steps before
    it run on a schedulable Node. The service and ``plan`` both ask this."""
    if mode == "never" or not steps:
        return None
    if mode == "always":
        return steps[0]
    return first_disruptive([step for step in steps if step not in idle], custom)
