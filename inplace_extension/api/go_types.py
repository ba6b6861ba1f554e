"""CAPI's Go types of the request fields we read: a JSON value of another type is ``InvalidRequest``.

CAPI encodes its typed objects with Go's ``encoding/json``, so a Machine's ``spec.version`` is always a
JSON string and a KubeadmConfig file's ``append`` a boolean; Go's own decoder refuses anything else
("cannot unmarshal number into Go struct field ... of type string"). A body with ``"version": 131`` was
not made by CAPI, and deciding on it would be a guess, so it is refused naming the field (never the
value). ``null`` is accepted wherever Go accepts it (it decodes to the zero value).

The table covers the fields the core reads or claims: the Machine spec (typed in CAPI's request, so
always checked; MachineSet's template spec too) and, when the bootstrap object is a
``bootstrap.cluster.x-k8s.io/v1beta2`` KubeadmConfig(Template), its claimed fields. Providers' objects
are free-form here (RawExtension).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from inplace_extension.errors import InvalidRequest

GoType = Literal["string", "bool", "int32", "object", "array"]
Path = tuple[str, ...]  # spec-relative JSON names; "*" = every item of an array or value of a map

_REF: Final[Mapping[Path, GoType]] = {
    (): "object",
    ("apiGroup",): "string",
    ("kind",): "string",
    ("name",): "string",
}


def _under(prefix: Path, table: Mapping[Path, GoType]) -> dict[Path, GoType]:
    return {prefix + path: go_type for path, go_type in table.items()}


MACHINE_SPEC: Final[Mapping[Path, GoType]] = {  # clusterv1.MachineSpec (v1beta2)
    ("clusterName",): "string",
    ("version",): "string",
    ("failureDomain",): "string",
    ("providerID",): "string",
    ("minReadySeconds",): "int32",
    ("bootstrap",): "object",
    ("bootstrap", "dataSecretName"): "string",
    **_under(("bootstrap", "configRef"), _REF),
    **_under(("infrastructureRef",), _REF),
    ("readinessGates",): "array",
    ("readinessGates", "*"): "object",
    ("readinessGates", "*", "conditionType"): "string",
    ("readinessGates", "*", "polarity"): "string",
    ("deletion",): "object",
    ("deletion", "nodeDrainTimeoutSeconds"): "int32",
    ("deletion", "nodeVolumeDetachTimeoutSeconds"): "int32",
    ("deletion", "nodeDeletionTimeoutSeconds"): "int32",
}

_KUBELET_ARGS: Final[Mapping[Path, GoType]] = {
    (): "object",
    ("nodeRegistration",): "object",
    ("nodeRegistration", "kubeletExtraArgs"): "array",
    ("nodeRegistration", "kubeletExtraArgs", "*"): "object",
    ("nodeRegistration", "kubeletExtraArgs", "*", "name"): "string",
    ("nodeRegistration", "kubeletExtraArgs", "*", "value"): "string",
}

KUBEADM_CONFIG_SPEC: Final[Mapping[Path, GoType]] = {  # bootstrapv1.KubeadmConfigSpec (v1beta2)
    ("files",): "array",
    ("files", "*"): "object",
    **{("files", "*", name): "string" for name in ("path", "owner", "permissions", "encoding", "content")},
    ("files", "*", "append"): "bool",
    ("files", "*", "contentFrom"): "object",
    ("users",): "array",
    ("users", "*"): "object",
    **{
        ("users", "*", name): "string"
        for name in ("name", "gecos", "groups", "homeDir", "shell", "passwd", "primaryGroup", "sudo")
    },
    ("users", "*", "inactive"): "bool",
    ("users", "*", "lockPassword"): "bool",
    ("users", "*", "passwdFrom"): "object",
    ("users", "*", "sshAuthorizedKeys"): "array",
    ("users", "*", "sshAuthorizedKeys", "*"): "string",
    ("ntp",): "object",
    ("ntp", "servers"): "array",
    ("ntp", "servers", "*"): "string",
    ("ntp", "enabled"): "bool",
    **_under(("joinConfiguration",), _KUBELET_ARGS),
    **_under(("initConfiguration",), _KUBELET_ARGS),
    ("clusterConfiguration",): "object",
    ("clusterConfiguration", "etcd"): "object",
    ("clusterConfiguration", "etcd", "local"): "object",
    ("clusterConfiguration", "etcd", "local", "imageTag"): "string",
    ("clusterConfiguration", "featureGates"): "object",
    ("clusterConfiguration", "featureGates", "*"): "bool",
    ("clusterConfiguration", "imageRepository"): "string",
    ("clusterConfiguration", "dns"): "object",
    ("clusterConfiguration", "dns", "imageTag"): "string",
}

MACHINE_SET_SPEC: Final[Mapping[Path, GoType]] = {  # clusterv1.MachineSetSpec: the fields around the template
    ("clusterName",): "string",
    ("replicas",): "int32",
    ("template",): "object",
    ("template", "spec"): "object",
    **_under(("template", "spec"), MACHINE_SPEC),
}

KUBEADM_CONFIG_TEMPLATE_SPEC: Final[Mapping[Path, GoType]] = {
    ("template",): "object",
    ("template", "spec"): "object",
    **_under(("template", "spec"), KUBEADM_CONFIG_SPEC),
}

_KUBEADM_GROUP_VERSION: Final = "bootstrap.cluster.x-k8s.io/v1beta2"
# request object key -> the spec table that applies whatever the object says (CAPI's typed objects)
TYPED_OBJECTS: Final[Mapping[str, Mapping[Path, GoType]]] = {
    "machine": MACHINE_SPEC,
    "machineSet": MACHINE_SET_SPEC,
}
# (apiVersion, kind) -> spec table, for the RawExtension objects whose kind we know
KNOWN_KINDS: Final[Mapping[tuple[str, str], Mapping[Path, GoType]]] = {
    (_KUBEADM_GROUP_VERSION, "KubeadmConfig"): KUBEADM_CONFIG_SPEC,
    (_KUBEADM_GROUP_VERSION, "KubeadmConfigTemplate"): KUBEADM_CONFIG_TEMPLATE_SPEC,
}

_PROBLEMS: Final[Mapping[GoType, str]] = {
    "string": "must be a string",
    "bool": "must be a boolean",
    "int32": "must be a 32-bit integer",
    "object": "must be a JSON object",
    "array": "must be a JSON array",
}

Trie = dict[str, Any]  # {"": GoType (optional), name: Trie, "*": Trie}


def _trie(table: Mapping[Path, GoType]) -> Trie:
    root: Trie = {}
    for path, go_type in table.items():
        node = root
        for name in path:
            node = node.setdefault(name, {})
        node[""] = go_type
    return root


def _fits(value: Any, go_type: GoType) -> bool:
    if value is None:  # Go decodes null into any field as its zero value
        return True
    if go_type == "string":
        return isinstance(value, str)
    if go_type == "bool":
        return isinstance(value, bool)
    if go_type == "int32":
        return type(value) is int and -(2**31) <= value < 2**31
    if go_type == "object":
        return isinstance(value, dict)
    return isinstance(value, list)


# the Python type of each Go type's JSON values, for leaves checked inline (int32 also needs its range)
_LEAF_TYPES: Final[Mapping[GoType, type]] = {"string": str, "bool": bool, "object": dict, "array": list}


@dataclass(frozen=True, slots=True)
class _Node:
    """A trie node prepared for the fast pass: its Go type and its children, the plain leaves apart."""

    go_type: GoType | None
    leaves: tuple[tuple[str, type], ...]  # named children with no children of their own: a type check
    inner: tuple[tuple[str, _Node], ...]  # the other named children
    every: _Node | None  # the ``*`` child
    every_leaf: type | None  # the ``*`` child's type when it is a plain leaf


def _is_leaf(trie: Trie) -> bool:
    return trie.keys() == {""} and trie[""] in _LEAF_TYPES


def _node(trie: Trie) -> _Node:
    named = [(name, child) for name, child in trie.items() if name not in ("", "*")]
    every = trie.get("*")
    return _Node(
        go_type=trie.get(""),
        leaves=tuple((name, _LEAF_TYPES[child[""]]) for name, child in named if _is_leaf(child)),
        inner=tuple((name, _node(child)) for name, child in named if not _is_leaf(child)),
        every=_node(every) if every is not None else None,
        every_leaf=_LEAF_TYPES[every[""]] if every is not None and _is_leaf(every) else None,
    )


def _all_fit(value: Any, node: _Node) -> bool:
    """Whether ``_walk`` would pass ``value``: the same checks, without building a field path per value.

    Exact types (``type(x) is str``) where ``_walk`` asks ``isinstance``: stricter for a subclass, which
    then only costs the slow walk, so the answer is always ``_walk``'s.
    """
    kind = type(value)
    if kind is dict:
        if node.go_type is not None and node.go_type != "object":
            return False
        for name, leaf_type in node.leaves:
            item = value.get(name)  # absent and null both pass
            if item is not None and type(item) is not leaf_type:
                return False
        for name, child in node.inner:
            item = value.get(name)
            if item is not None and not _all_fit(item, child):
                return False
        items: Any = value.values()
    elif kind is list:
        if node.go_type is not None and node.go_type != "array":
            return False
        items = value
    else:
        return value is None or node.go_type is None or _fits(value, node.go_type)
    every_leaf = node.every_leaf
    if every_leaf is not None:
        for item in items:
            if item is not None and type(item) is not every_leaf:
                return False
    elif node.every is not None:
        every = node.every
        for item in items:
            if item is not None and not _all_fit(item, every):
                return False
    return True


def _walk(value: Any, node: Trie, where: str) -> None:
    go_type = node.get("")
    if go_type is not None and not _fits(value, go_type):
        raise InvalidRequest(where, f"{_PROBLEMS[go_type]} (CAPI's Go type is {go_type})")
    if isinstance(value, dict):
        for key, item in value.items():
            child = node.get(key) if key not in ("", "*") else None
            if child is not None:
                _walk(item, child, f"{where}.{key}")
        if "*" in node:
            for key, item in value.items():
                _walk(item, node["*"], f"{where}.{key}")
    elif isinstance(value, list) and "*" in node:
        for index, item in enumerate(value):
            _walk(item, node["*"], f"{where}[{index}]")


_TRIES: Final = {
    id(table): (trie, _node(trie))
    for table in (*TYPED_OBJECTS.values(), *KNOWN_KINDS.values())
    for trie in (_trie(table),)
}


def check_objects(objects: Mapping[str, Any], where: str) -> None:
    """Check the specs of a request's objects (wire key -> object JSON) against CAPI's Go types."""
    for key, obj in objects.items():
        if not isinstance(obj, Mapping):
            continue
        table = TYPED_OBJECTS.get(key) or KNOWN_KINDS.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
        if table is not None and "spec" in obj:
            trie, node = _TRIES[id(table)]
            if not _all_fit(obj["spec"], node):  # the common case passes without naming a single path
                _walk(obj["spec"], trie, f"{where}.{key}.spec")
