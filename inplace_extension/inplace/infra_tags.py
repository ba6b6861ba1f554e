"""Infrastructure tags the infrastructure provider itself applies to a running machine: the one table of
them (kind, field, the provider's last-applied annotation), the guard of a claimed change, and the pure
judgement of whether the provider has applied the desired tags yet.

No host work: CAPI's in-place trigger applies the desired infrastructure machine onto the existing one,
and the provider's own controller re-applies the tags to the running instance on every reconcile,
recording what it applied in an annotation on the infrastructure machine. The service claims such a
change only in the Kubernetes-aware mode, where UpdateMachine can read that annotation and answer done
once it holds the desired tags (``inplace_extension.kubeaware.infra_tags`` reads it); without cluster
access it could not tell when the provider is done, so the change is declined and rolls out.

The facts of the table, read in the providers' sources:

- CAPA (v2.8.4, as kubelab pins it; v2.10.0 the same): ``AWSMachine.ValidateUpdate``
  (``api/v1beta2/awsmachine_webhook.go``) deletes ``additionalTags`` from both specs before its
  immutability comparison; ``ensureTags`` (``controllers/awsmachine_tags.go``) runs on every
  reconcile of an instance in a known state, sends the created/changed/deleted tags to EC2 and records
  the applied set, JSON, in
  ``sigs.k8s.io/cluster-api-provider-aws-last-applied-tags``. The set it applies is the AWSCluster's
  ``additionalTags`` merged with the AWSMachine's (``MachineScope.AdditionalTags``), so the annotation
  may hold more than the machine's own tags.
- CAPZ: the same shape, annotation ``sigs.k8s.io/cluster-api-provider-azure-last-applied-tags-vm``.
- CAPG: ``GCPMachine.spec.additionalLabels`` pass its webhook but are applied only when an instance is
  created, never to a running one: claiming them would report an update that never happens.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from inplace_extension.inplace.pointers import MISSING, get_in, is_object, parse_pointer

CAPABILITY: Final = "infrastructure_tags"  # the name verdicts, messages and plan use for these claims
INFRASTRUCTURE_GROUP: Final = "infrastructure.cluster.x-k8s.io"


@dataclass(frozen=True)
class ProviderTags:
    """One provider's tags field: its machine-level ``kind`` (the template is ``<kind>Template``), the
    field ``pointer`` relative to the spec, and the ``annotation`` in which its controller records the
    tags it applied (a JSON object)."""

    provider: str
    kind: str
    pointer: str
    annotation: str


PROVIDER_TAGS: Final[tuple[ProviderTags, ...]] = (
    ProviderTags(
        provider="CAPA",
        kind="AWSMachine",
        pointer="/additionalTags",
        annotation="sigs.k8s.io/cluster-api-provider-aws-last-applied-tags",
    ),
    ProviderTags(
        provider="CAPZ",
        kind="AzureMachine",
        pointer="/additionalTags",
        annotation="sigs.k8s.io/cluster-api-provider-azure-last-applied-tags-vm",
    ),
)

# (kind, pointer) -> why it is never claimed, although it looks like the fields above
DECLINED: Final[Mapping[tuple[str, str], str]] = {
    ("GCPMachine", "/additionalLabels"): (
        "CAPG accepts a change but applies labels only when it creates an instance, never to a running one"
    ),
}

NOT_KUBE_AWARE: Final = (
    "the provider applies it in place, but only the Kubernetes-aware mode (--kube) can see when it has"
)


def provider_of(obj: Mapping[str, Any], template: bool) -> ProviderTags | None:
    """The table row for an infrastructure machine (``template``: its template), any API version."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    if api_version.rpartition("/")[0] != INFRASTRUCTURE_GROUP:
        return None
    suffix = "Template" if template else ""
    return next((row for row in PROVIDER_TAGS if row.kind + suffix == kind), None)


def declined_reason(kind: str, pointer: str, template: bool) -> str | None:
    """Why a changed field of ``kind`` at ``pointer`` is declined by name (CAPG), or None."""
    machine_kind = kind.removesuffix("Template") if template else kind
    for (declined_kind, declined_pointer), why in DECLINED.items():
        if machine_kind == declined_kind and (pointer + "/").startswith(declined_pointer + "/"):
            return why
    return None


def tags_problem(old: Any, new: Any) -> str | None:
    """Why a change of the tags from ``old`` to ``new`` is not claimed, or None.

    A removed tag is declined: the annotation also holds the AWSCluster's tags, so UpdateMachine (which
    sees only the desired tags) could not tell the removal was applied.
    """
    if new is MISSING:
        return "removes every tag; only adding or changing tags is claimed"
    if not _is_tag_map(new):
        return "must be a map of strings to strings"
    if old is MISSING:
        return None
    if not _is_tag_map(old):
        return "the current value is not a map of strings to strings"
    removed = sorted(set(old) - set(new))
    if removed:
        return f"removes tags ({', '.join(removed)}); only adding or changing tags is claimed"
    return None


def _is_tag_map(value: Any) -> bool:
    return is_object(value) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


@dataclass(frozen=True)
class DesiredTags:
    """The tags an UpdateMachine request wants on its infrastructure machine ``namespace``/``name``."""

    provider: ProviderTags
    api_version: str
    namespace: str
    name: str
    tags: Mapping[str, str]


def desired_tags(infrastructure_machine: Any) -> DesiredTags | None:
    """The desired tags of an UpdateMachine request's infrastructure machine, or None when it is not of
    a provider of the table or states no tags."""
    if not is_object(infrastructure_machine):
        return None
    provider = provider_of(infrastructure_machine, template=False)
    if provider is None:
        return None
    tags = get_in(infrastructure_machine, ("spec", *parse_pointer(provider.pointer)))
    metadata = infrastructure_machine.get("metadata")
    namespace = metadata.get("namespace") if is_object(metadata) else None
    name = metadata.get("name") if is_object(metadata) else None
    if not _is_tag_map(tags) or not tags or not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return DesiredTags(provider, str(infrastructure_machine["apiVersion"]), namespace, name, dict(tags))


def missing_tags(desired: Mapping[str, str], annotation: str | None) -> tuple[str, ...]:
    """The keys of ``desired`` whose value the provider's last-applied ``annotation`` does not hold yet
    (all of them while it is absent or not a JSON object), sorted."""
    applied: Any = {}
    if annotation:
        try:
            applied = json.loads(annotation)
        except ValueError:
            applied = {}
    if not isinstance(applied, dict):
        applied = {}
    return tuple(sorted(key for key, value in desired.items() if applied.get(key) != value))
