"""What ``plan --old FILE --new FILE`` reads: Kubernetes objects from files, sorted into the pairs a
preview compares, and turned into the requests the service would get for them.

A file holds JSON or YAML: one object, several YAML documents, or a ``List`` (``kubectl get -o yaml``).
Each object is one of: the machine template (``MachineDeployment`` or ``MachineSet``), the
``KubeadmConfigTemplate``, a ``KubeadmControlPlane`` (it carries both for control plane Machines), an
infrastructure machine template (``infrastructure.cluster.x-k8s.io``, ``*MachineTemplate``), a
``MachineClass`` (MCM), or a machine to preview (a CAPI ``Machine``, an MCM ``Node``). Old and new must
hold the same kinds; what CAPI would send is then built from them (:func:`machine_set_request`,
:func:`machine_request`, :func:`update_request`) and judged by the hooks' own functions. Every error
names the file and the field (:class:`PlanInputError`).
"""

from __future__ import annotations

import datetime
import enum
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from inplace_extension.inplace.objects import CONTROL_PLANE_LABEL

CAPI_GROUP: Final = "cluster.x-k8s.io"
BOOTSTRAP_GROUP: Final = "bootstrap.cluster.x-k8s.io"
CONTROL_PLANE_GROUP: Final = "controlplane.cluster.x-k8s.io"
CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_NAME_LABEL: Final = "cluster.x-k8s.io/control-plane-name"
INFRASTRUCTURE_GROUP: Final = "infrastructure.cluster.x-k8s.io"
MCM_GROUP: Final = "machine.sapcloud.io"
CAPI_VERSION: Final = "v1beta2"  # the only version the claims understand (inplace/objects.py)
# stands in for an object the user did not give: the same on both sides, so it changes nothing
NOT_GIVEN: Final = "(not given)"
EXPECTED: Final = (
    "MachineDeployment or MachineSet, KubeadmConfigTemplate, KubeadmControlPlane, an infrastructure "
    f"machine template ({INFRASTRUCTURE_GROUP} *MachineTemplate), MachineClass ({MCM_GROUP}), Machine or Node"
)


class PlanInputError(ValueError):
    """A file ``plan`` cannot read or compare; the message names the file and the field."""


class Part(enum.Enum):
    """What an object is to a preview (its slot in the pair)."""

    MACHINE_TEMPLATE = "MachineDeployment/MachineSet"
    BOOTSTRAP = "KubeadmConfigTemplate"
    CONTROL_PLANE = "KubeadmControlPlane"
    INFRASTRUCTURE = "infrastructure machine template"
    MACHINE_CLASS = "MachineClass"


@dataclass(frozen=True)
class Found:
    """One object of a file and where it is (``old.yaml: items[2]``)."""

    where: str
    obj: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "default")


@dataclass(frozen=True)
class Side:
    """The objects of one file (``--old`` or ``--new``), by part; the machines it lists."""

    path: str
    parts: Mapping[Part, Found]
    machines: tuple[Found, ...] = ()


@dataclass(frozen=True)
class Machine:
    """A machine to preview: its name (a CAPI Machine, or an MCM Node), labels and annotations (the
    inventory's label selectors, the address annotation, the windows' labels), and its status addresses."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    addresses: tuple[tuple[str, str], ...] = ()


def read_side(path: str) -> Side:
    """The objects of one file, sorted into parts; raises PlanInputError naming the file and field."""
    parts: dict[Part, Found] = {}
    machines: list[Found] = []
    for found in _objects(path):
        part = _part_of(found)
        if part is None:
            machines.append(found)
            continue
        if part in parts:
            raise PlanInputError(
                f"{found.where}: a second {part.value} (the first is {parts[part].where}); "
                "give one of each per plan"
            )
        parts[part] = found
    return Side(path, parts, tuple(machines))


def pair(old: Side, new: Side) -> None:
    """Old and new must hold the same parts, and either MCM's or CAPI's."""
    for part in Part:
        if (part in old.parts) != (part in new.parts):
            has, lacks = (old, new) if part in old.parts else (new, old)
            raise PlanInputError(
                f"{lacks.path}: no {part.value}, but {has.path} has one ({has.parts[part].where}); "
                "give both sides of each object"
            )
    if not new.parts:
        raise PlanInputError(f"{new.path}: no object to compare; expected {EXPECTED}")
    if Part.CONTROL_PLANE in new.parts:
        for part in (Part.MACHINE_TEMPLATE, Part.BOOTSTRAP):
            if part in new.parts:
                raise PlanInputError(
                    f"{new.parts[part].where}: a {part.value} beside a KubeadmControlPlane (it holds the "
                    "version and the KubeadmConfig spec of its Machines); plan one or the other"
                )
    if Part.MACHINE_CLASS in new.parts and len(new.parts) > 1:
        others = ", ".join(found.where for part, found in new.parts.items() if part is not Part.MACHINE_CLASS)
        raise PlanInputError(
            f"{new.path}: a MachineClass (MCM) cannot be compared with CAPI objects ({others})"
        )


def machines_of(sides: tuple[Side, ...], names: tuple[str, ...], kind: str) -> tuple[Machine, ...]:
    """The machines to preview: ``--machine`` names first, then the ``kind`` objects of the files (the new
    file's win over the old's); a name given both ways takes the object's labels and annotations."""
    objects: dict[str, Found] = {}
    for side in sides:
        for found in side.machines:
            if found.kind != kind:
                raise PlanInputError(f"{found.where}: a {found.kind}, but this plan previews {kind}s")
            objects[found.name] = found
    wanted = list(dict.fromkeys((*names, *objects)))
    return tuple(_machine(name, objects.get(name)) for name in wanted)


def machine_of_object(obj: Mapping[str, Any], where: str) -> Machine:
    """A CAPI Machine read from the cluster (``plan --machines-of``): its name, labels, annotations and
    ``status.addresses``, as a Machine object in a file gives them."""
    found = Found(where, obj)
    return _machine(found.name, found)


def _machine(name: str, found: Found | None) -> Machine:
    if found is None:
        return Machine(name)
    metadata = found.obj["metadata"]
    addresses = _get(found.obj, "status", "addresses")
    pairs = tuple(
        (str(item.get("type")), str(item.get("address")))
        for item in (addresses if isinstance(addresses, list) else [])
        if isinstance(item, Mapping)
    )
    return Machine(
        name,
        _strings(found, metadata.get("labels"), "labels"),
        _strings(found, metadata.get("annotations"), "annotations"),
        pairs,
    )


# -- CAPI: the requests built from the pairs ------------------------------------------------------


def machine_set_request(old: Side, new: Side) -> dict[str, Any]:
    """The CanUpdateMachineSetRequest CAPI sends for a change from ``old`` to ``new``: the MachineSet,
    infrastructure machine template and bootstrap config template of each side."""
    return {
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "CanUpdateMachineSetRequest",
        "current": _template_objects(old, new),
        "desired": _template_objects(new, old),
    }


def _template_objects(side: Side, other: Side) -> dict[str, Any]:
    anchor = next(iter(side.parts.values()))
    objects: dict[str, Any] = {"machineSet": _machine_set(side.parts.get(Part.MACHINE_TEMPLATE), anchor)}
    infrastructure = side.parts.get(Part.INFRASTRUCTURE)
    objects["infrastructureMachineTemplate"] = (
        dict(infrastructure.obj) if infrastructure is not None else {"kind": NOT_GIVEN}
    )
    bootstrap = side.parts.get(Part.BOOTSTRAP)
    if bootstrap is not None:
        objects["bootstrapConfigTemplate"] = dict(bootstrap.obj)
    return objects


def _machine_set(template: Found | None, anchor: Found) -> dict[str, Any]:
    """A MachineSet with the machine template of a MachineDeployment or MachineSet (what CAPI compares);
    without one, an empty template (the same on both sides)."""
    if template is None:
        metadata = {"name": anchor.name, "namespace": anchor.namespace}
        return {
            "apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}",
            "kind": "MachineSet",
            "metadata": metadata,
            "spec": {"template": {"spec": {}}},
        }
    obj = template.obj
    return {
        "apiVersion": obj["apiVersion"],
        "kind": "MachineSet",
        "metadata": {"name": template.name, "namespace": template.namespace},
        "spec": {"clusterName": obj["spec"].get("clusterName"), "template": obj["spec"]["template"]},
    }


def machine_request(old: Side, new: Side, machine: Machine) -> dict[str, Any]:
    """The CanUpdateMachineRequest the KubeadmControlPlane controller sends for one of its Machines when
    the KubeadmControlPlane (and its infrastructure machine template) change from ``old`` to ``new``."""
    return {
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "CanUpdateMachineRequest",
        "current": _control_plane_objects(old, machine),
        "desired": _control_plane_objects(new, machine),
    }


def _control_plane_objects(side: Side, machine: Machine) -> dict[str, Any]:
    """A control plane Machine's objects as KCP states them: the Machine (its version, the control plane
    label), the KubeadmConfig (the KubeadmControlPlane's ``kubeadmConfigSpec``; KCP sends no
    ``joinConfiguration.discovery``) and the infrastructure machine of the template."""
    found = side.parts[Part.CONTROL_PLANE]
    spec = found.obj["spec"]
    template = spec.get("machineTemplate") or {}
    # the labels KCP puts on its Machines: the template's, the cluster's name, the control plane's
    cluster = (found.obj["metadata"].get("labels") or {}).get(CLUSTER_NAME_LABEL)
    labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        **({CLUSTER_NAME_LABEL: cluster} if isinstance(cluster, str) else {}),
        CONTROL_PLANE_LABEL: "",
        CONTROL_PLANE_NAME_LABEL: found.name,
        **machine.labels,
    }
    metadata: dict[str, Any] = {"name": machine.name, "namespace": found.namespace, "labels": labels}
    if machine.annotations:
        metadata["annotations"] = dict(machine.annotations)
    machine_spec = {key: spec[key] for key in ("version",) if key in spec}
    config = dict(spec.get("kubeadmConfigSpec") or {})
    join = config.get("joinConfiguration")
    if isinstance(join, Mapping) and "discovery" in join:
        config["joinConfiguration"] = {key: value for key, value in join.items() if key != "discovery"}
    infrastructure = side.parts.get(Part.INFRASTRUCTURE)
    own = {"name": machine.name, "namespace": found.namespace}
    return {
        "machine": {
            "apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}",
            "kind": "Machine",
            "metadata": metadata,
            "spec": machine_spec,
        },
        "infrastructureMachine": (
            _from_template(infrastructure.obj, own) if infrastructure is not None else {"kind": NOT_GIVEN}
        ),
        "bootstrapConfig": {
            "apiVersion": f"{BOOTSTRAP_GROUP}/{CAPI_VERSION}",
            "kind": "KubeadmConfig",
            "metadata": own,
            "spec": config,
        },
    }


def update_request(desired: Mapping[str, Any], machine: Machine, namespace: str) -> dict[str, Any]:
    """The UpdateMachineRequest CAPI sends for ``machine`` once the templates of a CanUpdateMachineSet
    request's ``desired`` apply to it: its Machine (template labels, its own labels and annotations), its
    infrastructure machine and its KubeadmConfig, each with the template's spec."""
    machine_set = desired["machineSet"]
    template = machine_set["spec"]["template"]
    labels = {**(_get(template, "metadata", "labels") or {}), **machine.labels}
    metadata: dict[str, Any] = {"name": machine.name, "namespace": namespace, "labels": labels}
    if machine.annotations:
        metadata["annotations"] = dict(machine.annotations)
    objects: dict[str, Any] = {
        "machine": {
            "apiVersion": machine_set.get("apiVersion") or f"{CAPI_GROUP}/{CAPI_VERSION}",
            "kind": "Machine",
            "metadata": metadata,
            "spec": template.get("spec") or {},
        },
        "infrastructureMachine": _from_template(desired["infrastructureMachineTemplate"], metadata),
    }
    bootstrap = desired.get("bootstrapConfigTemplate")
    if bootstrap is not None:
        objects["bootstrapConfig"] = _from_template(bootstrap, metadata)
    return {
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "UpdateMachineRequest",
        "desired": objects,
    }


def _from_template(template: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The machine-level object a template stamps out: ``KubeadmConfigTemplate`` -> ``KubeadmConfig``."""
    kind = str(template.get("kind"))
    obj: dict[str, Any] = {"kind": kind.removesuffix("Template") if kind != NOT_GIVEN else kind}
    if "apiVersion" in template:
        obj["apiVersion"] = template["apiVersion"]
    obj["metadata"] = {"name": metadata["name"], "namespace": metadata["namespace"]}
    spec = _get(template, "spec", "template", "spec")
    if spec is not None:
        obj["spec"] = spec
    return obj


# -- reading files ---------------------------------------------------------------------------------


def json_bytes(document: Any) -> bytes:
    """A document read from YAML as the JSON the API server would have sent: YAML's unquoted timestamps
    (``creationTimestamp: 2024-01-01T00:00:00Z`` typed by hand) become RFC 3339 strings again."""

    def plain(value: Any) -> str:
        if isinstance(value, datetime.datetime | datetime.date):
            return value.isoformat().replace("+00:00", "Z")
        return str(value)  # any other YAML-only type (a set, binary): its text, as a string field

    return json.dumps(document, default=plain).encode()


def read_request(path: str) -> Any:
    """A saved hook request (one JSON or YAML document)."""
    documents = _documents(path)
    if len(documents) != 1:
        raise PlanInputError(f"{path}: {len(documents)} documents; a request is one")
    return documents[0]


def _documents(path: str) -> list[Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanInputError(f"{path}: not UTF-8 text") from None
    try:
        documents = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f"line {mark.line + 1}: " if mark is not None else ""
            problem = getattr(exc, "problem", None) or "invalid"
            raise PlanInputError(f"{path}: not JSON or YAML: {line}{problem}") from None
    return [document for document in documents if document is not None]


def _objects(path: str) -> list[Found]:
    documents = _documents(path)
    found: list[Found] = []
    for index, document in enumerate(documents):
        where = path if len(documents) == 1 else f"{path}: document {index + 1}"
        if not isinstance(document, Mapping):
            raise PlanInputError(f"{where}: must be an object (a Kubernetes object or a List)")
        kind = document.get("kind")
        items = document.get("items")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
            found.extend(_checked(f"{where}: items[{i}]", item) for i, item in enumerate(items))
        else:
            found.append(_checked(where, document))
    if not found:
        raise PlanInputError(f"{path}: no object in it")
    return found


def _checked(where: str, obj: Any) -> Found:
    """An object with the fields every part needs: apiVersion, kind, metadata.name."""
    if not isinstance(obj, Mapping):
        raise PlanInputError(f"{where}: must be an object")
    if "current" in obj or "desired" in obj:
        raise PlanInputError(f"{where}: a hook request; preview it with: plan FILE")
    for key in ("apiVersion", "kind"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise PlanInputError(f"{where}: {key}: must be a non-empty string")
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        raise PlanInputError(f"{where}: metadata: must be an object")
    if not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise PlanInputError(f"{where}: metadata.name: must be a non-empty string")
    namespace = metadata.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise PlanInputError(f"{where}: metadata.namespace: must be a string")
    return Found(where, obj)


def _part_of(found: Found) -> Part | None:
    """The part an object plays (None: a machine to preview); checks the fields that part reads."""
    group, _, version = str(found.obj["apiVersion"]).rpartition("/")
    kind = found.kind
    part: Part | None
    if group == CAPI_GROUP and kind in ("MachineDeployment", "MachineSet"):
        part = Part.MACHINE_TEMPLATE
    elif group == BOOTSTRAP_GROUP and kind == "KubeadmConfigTemplate":
        part = Part.BOOTSTRAP
    elif group == CONTROL_PLANE_GROUP and kind == "KubeadmControlPlane":
        part = Part.CONTROL_PLANE
    elif group == INFRASTRUCTURE_GROUP and kind.endswith("MachineTemplate"):
        part = Part.INFRASTRUCTURE
    elif group == MCM_GROUP and kind == "MachineClass":
        return Part.MACHINE_CLASS
    elif (group, kind) in ((CAPI_GROUP, "Machine"), ("", "Node")):
        return None
    else:
        raise PlanInputError(f"{found.where}: kind {kind} ({found.obj['apiVersion']}): expected {EXPECTED}")
    if group != INFRASTRUCTURE_GROUP and version != CAPI_VERSION:
        raise PlanInputError(
            f"{found.where}: apiVersion: {found.obj['apiVersion']}: only {group}/{CAPI_VERSION} is "
            "understood (what CAPI v1.12+ serves and sends)"
        )
    if part is Part.CONTROL_PLANE:
        _control_plane_fields(found)
        return part
    template = _get(found.obj, "spec", "template")
    if not isinstance(template, Mapping):
        raise PlanInputError(f"{found.where}: spec.template: must be an object")
    spec = template.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise PlanInputError(f"{found.where}: spec.template.spec: must be an object")
    if part is Part.MACHINE_TEMPLATE and not isinstance(spec, Mapping):
        raise PlanInputError(f"{found.where}: spec.template.spec: must be an object")
    return part


def _control_plane_fields(found: Found) -> None:
    spec = found.obj.get("spec")
    if not isinstance(spec, Mapping):
        raise PlanInputError(f"{found.where}: spec: must be an object")
    for key in ("kubeadmConfigSpec", "machineTemplate"):
        if spec.get(key) is not None and not isinstance(spec[key], Mapping):
            raise PlanInputError(f"{found.where}: spec.{key}: must be an object")


def _strings(found: Found, value: Any, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise PlanInputError(f"{found.where}: metadata.{key}: must map names to strings")
    return {str(k): v for k, v in value.items()}


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj
