"""The lab provider's CustomResourceDefinitions, written by us: LabCluster, LabMachine and LabMachineTemplate
in ``infrastructure.lab.inplace-extension.dev/v1alpha1``, the shapes the CAPI v1beta2 InfraCluster and
InfraMachine contracts ask for (``docs/book/src/developer/providers/contracts/`` of CAPI v1.14.2).

Each CRD carries the contract label ``cluster.x-k8s.io/v1beta2: v1alpha1`` (CAPI's controllers find the
version to use for a contract through it) and the ``cluster-api`` category. The schemas are structural and
name every field the contract reads: ``spec.providerID``, ``status.initialization.provisioned``,
``status.addresses`` and ``status.conditions`` of a LabMachine; ``spec.controlPlaneEndpoint`` and
``status.initialization.provisioned`` of a LabCluster; ``spec.template.spec`` of a LabMachineTemplate (for
MachineDeployments and KubeadmControlPlane). ``spec.image`` and ``status.nodeName`` are the lab's own: the
machine image to provision (a Kubernetes version, as a bare-metal provider's template names the image to
write, Metal3's ``image.url``), and the pool node the LabMachine holds.
No LabClusterTemplate: it serves only ClusterClass, which the lab does not use.
"""

from __future__ import annotations

from typing import Any

GROUP = "infrastructure.lab.inplace-extension.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CONTRACT_LABELS = {
    "cluster.x-k8s.io/v1beta2": VERSION,
    "cluster.x-k8s.io/provider": "infrastructure-lab",
}
PLURALS = {
    "LabCluster": "labclusters",
    "LabMachine": "labmachines",
    "LabMachineTemplate": "labmachinetemplates",
}

IMAGE_PATTERN = r"^v[0-9]+\.[0-9]+\.[0-9]+$"
_STRING = {"type": "string"}
_CONDITIONS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": _STRING,
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": _STRING,
            "message": _STRING,
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    },
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
_INITIALIZATION = {"type": "object", "properties": {"provisioned": {"type": "boolean"}}}
_MACHINE_SPEC = {
    "type": "object",
    "properties": {
        "providerID": {"type": "string", "minLength": 1, "maxLength": 512},
        # the lab's own: the machine image to provision, by its Kubernetes version (its kubelet and
        # kubeadm, which every pool node carries); unset: the node's own
        "image": {"type": "string", "pattern": IMAGE_PATTERN},
    },
}
_MACHINE_STATUS = {
    "type": "object",
    "properties": {
        "initialization": _INITIALIZATION,
        "addresses": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "address"],
                "properties": {
                    "type": {
                        "type": "string",
                        "enum": ["Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"],
                    },
                    "address": _STRING,
                },
            },
        },
        "conditions": _CONDITIONS,
        "nodeName": _STRING,
    },
}
_CLUSTER_SPEC = {
    "type": "object",
    "properties": {
        "controlPlaneEndpoint": {
            "type": "object",
            "properties": {"host": _STRING, "port": {"type": "integer", "format": "int32"}},
        }
    },
}
_CLUSTER_STATUS = {
    "type": "object",
    "properties": {"initialization": _INITIALIZATION, "conditions": _CONDITIONS},
}
_TEMPLATE_SPEC = {
    "type": "object",
    "required": ["template"],
    "properties": {
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {
                        "labels": {"type": "object", "additionalProperties": _STRING},
                        "annotations": {"type": "object", "additionalProperties": _STRING},
                    },
                },
                "spec": _MACHINE_SPEC,
            },
        }
    },
}
_READY = {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'}
_REASON = {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'}


def _crd(
    kind: str, spec: dict[str, Any], status: dict[str, Any] | None, columns: list[dict[str, str]]
) -> dict[str, Any]:
    plural = PLURALS[kind]
    properties: dict[str, Any] = {
        "apiVersion": _STRING,
        "kind": _STRING,
        "metadata": {"type": "object"},
        "spec": spec,
    }
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": properties}},
        "additionalPrinterColumns": columns,
    }
    if status is not None:
        properties["status"] = status
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": dict(CONTRACT_LABELS)},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "categories": ["cluster-api"],
            },
            "versions": [version],
        },
    }


def definitions() -> list[dict[str, Any]]:
    node = {"name": "Node", "type": "string", "jsonPath": ".status.nodeName"}
    provider_id = {"name": "ProviderID", "type": "string", "jsonPath": ".spec.providerID"}
    endpoint = {"name": "Endpoint", "type": "string", "jsonPath": ".spec.controlPlaneEndpoint.host"}
    return [
        _crd("LabCluster", _CLUSTER_SPEC, _CLUSTER_STATUS, [endpoint, _READY, _REASON]),
        _crd("LabMachine", _MACHINE_SPEC, _MACHINE_STATUS, [node, provider_id, _READY, _REASON]),
        _crd("LabMachineTemplate", _TEMPLATE_SPEC, None, []),
    ]
