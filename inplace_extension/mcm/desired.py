"""The desired state of an MCM in-place update: where it lives, its schema, and how it becomes a plan.

MCM passes no payload to the node-side updater. The one place we read is the **MachineClass of the
new MachineSet**, key ``providerSpec.inPlaceUpdate`` (:class:`InPlaceUpdateSpec`). Why there: in MCM
v0.62.1 a new MachineSet (and so an in-place rollout) is started only by a change of the
MachineDeployment's ``spec.template`` that ``EqualIgnoreHash`` sees - template labels/annotations and
``class.name`` - while ``nodeTemplate`` and the MachineConfiguration fields start nothing
(docs/mcm-contract.md, "What starts a rollout"). Pointing the template at a new MachineClass is how
pools are changed anyway (Gardener names classes by a hash of their content), so a new desired state =
a new MachineClass.
The Machine itself is not read for it: during the update it still belongs to the old MachineSet, and
MCM never updates its ``class.name`` (docs/mcm-contract.md, "Where the desired state comes from").

Path: Node label ``node.gardener.cloud/machine-name`` -> Machine -> its MachineSet (controller owner)
-> that MachineSet's MachineDeployment -> the MachineDeployment's current MachineSet (the one whose
template equals the deployment's, ignoring ``machine-template-hash``) -> its MachineClass.

The spec is read by the capabilities directly (:func:`plan_for`): ``kubernetesVersion`` is what
``Machine.spec.version`` is to the CAPI side, ``kubeadmConfigSpec`` a KubeadmConfig's ``spec``,
``infrastructure`` the machine-level object user-defined capabilities claim fields of; so the plan,
fingerprint, role inputs and injection rules are the same as for an UpdateMachine request with those
values, and every error names its ``providerSpec.inPlaceUpdate`` path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inplace_extension.errors import ExtensionError
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.inplace.entries import INIT_ARGS, JOIN_ARGS, TEMPLATE_PROBLEM, holds_template
from inplace_extension.inplace.plan import DesiredObjects, Plan, PlanError, plan_capabilities
from inplace_extension.inplace.pointers import get_in
from inplace_extension.validation import problems

MACHINE_NAME_LABEL: Final = "node.gardener.cloud/machine-name"
TEMPLATE_HASH_LABEL: Final = "machine-template-hash"
SPEC_KEY: Final = "inPlaceUpdate"
SPEC_PATH: Final = f"providerSpec.{SPEC_KEY}"


class DesiredStateError(ExtensionError):
    """No usable desired state; ``reason`` is stable CamelCase, the message names objects, never values."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason)


class InfrastructureSpec(BaseModel):
    """The machine-level object user-defined capabilities claim fields of (e.g. ``Metal3Machine``)."""

    model_config = ConfigDict(extra="forbid")
    api_version: str = Field("infrastructure.example/v1", alias="apiVersion")
    kind: str = Field(min_length=1)
    spec: dict[str, Any]


class InPlaceUpdateSpec(BaseModel):
    """``providerSpec.inPlaceUpdate`` of a MachineClass. Every part is optional; what is present is
    converged on the host (the same capabilities as the CAPI side):

    - ``kubernetesVersion``: like ``Machine.spec.version`` (``v1.31.0``);
    - ``kubeadmConfigSpec``: a KubeadmConfig v1beta2 ``spec``; read are ``files``, ``users``, ``ntp`` and
      ``joinConfiguration.nodeRegistration.kubeletExtraArgs`` (a list of ``{name, value}``);
    - ``infrastructure``: ``{kind, spec}`` for user-defined capabilities (``--capabilities-file``).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    kubernetes_version: str | None = Field(None, alias="kubernetesVersion")
    kubeadm_config_spec: dict[str, Any] | None = Field(None, alias="kubeadmConfigSpec")
    infrastructure: InfrastructureSpec | None = None


def parse_spec(machine_class: Mapping[str, Any]) -> InPlaceUpdateSpec:
    name = machine_class.get("metadata", {}).get("name", "?")
    provider_spec = machine_class.get("providerSpec")
    raw = provider_spec.get(SPEC_KEY) if isinstance(provider_spec, Mapping) else None
    if raw is None:
        raise DesiredStateError("NoDesiredState", f"MachineClass {name} has no {SPEC_PATH}")
    try:
        return InPlaceUpdateSpec.model_validate(raw)
    except ValidationError as exc:
        where = ", ".join(
            ".".join(str(part) for part in problem.loc) + ": " + problem.message
            for problem in problems(exc, InPlaceUpdateSpec)
        )
        raise DesiredStateError("InvalidDesiredState", f"MachineClass {name} {SPEC_PATH}: {where}") from None


def _refuse_templates(spec: InPlaceUpdateSpec) -> None:
    """A cloud-init template (``{{ }}``/``{% %}``) is rendered only at bootstrap. The CAPI side declines
    such a change to a rollout; MCM has no such question, so the desired state is refused instead of
    the entry being left out silently (the Node would be answered ``successful`` without it)."""
    kubeadm = spec.kubeadm_config_spec or {}
    for key in ("files", "users", "ntp"):
        value = kubeadm.get(key)
        entries = value if isinstance(value, list) else [value]
        for index, entry in enumerate(entries):
            if holds_template(entry):
                where = f"{key}[{index}]" if isinstance(value, list) else key
                raise DesiredStateError(
                    "InvalidDesiredState", f"{SPEC_PATH}.kubeadmConfigSpec.{where} {TEMPLATE_PROBLEM}"
                )
    for tokens in (JOIN_ARGS, INIT_ARGS):
        if holds_template(get_in(kubeadm, tokens)):
            path = ".".join(tokens)
            raise DesiredStateError(
                "InvalidDesiredState", f"{SPEC_PATH}.kubeadmConfigSpec.{path} {TEMPLATE_PROBLEM}"
            )


def plan_for(spec: InPlaceUpdateSpec, namespace: str, node: str, custom: CustomTable = NO_CUSTOM) -> Plan:
    """The plan for ``spec`` on ``node`` (one run per Node): the same capabilities, inputs and
    fingerprint as an UpdateMachine request with the same desired values; errors name
    ``providerSpec.inPlaceUpdate`` paths."""
    _refuse_templates(spec)
    machine_spec = {} if spec.kubernetes_version is None else {"version": spec.kubernetes_version}
    objects = DesiredObjects(
        machine_spec,
        control_plane=False,  # MCM's machines are workers
        bootstrap_spec=spec.kubeadm_config_spec,
        version_path=f"{SPEC_PATH}.kubernetesVersion",
        bootstrap_path=f"{SPEC_PATH}.kubeadmConfigSpec",
    )
    # what user-defined capabilities claim, by kind: the Machine, its KubeadmConfig, its infrastructure
    specs: dict[str, Mapping[str, Any]] = {"Machine": machine_spec}
    if spec.kubeadm_config_spec is not None:
        specs["KubeadmConfig"] = spec.kubeadm_config_spec
    if spec.infrastructure is not None:
        specs.setdefault(spec.infrastructure.kind, spec.infrastructure.spec)
    try:
        return plan_capabilities(namespace, node, objects, custom, specs)
    except PlanError as exc:
        raise DesiredStateError("InvalidDesiredState", str(exc)) from None


# -- the path from a Machine to its MachineClass --------------------------------------------------


def controller_owner(obj: Mapping[str, Any], kind: str) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref.get("name"))
    return None


def _without_hash(template: Mapping[str, Any]) -> dict[str, Any]:
    metadata = dict(template.get("metadata") or {})
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k != TEMPLATE_HASH_LABEL}
    metadata["labels"] = labels
    metadata.pop("creationTimestamp", None)
    return {**template, "metadata": metadata}


def current_machine_set(
    deployment: Mapping[str, Any], machine_sets: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The deployment's MachineSet whose template equals the deployment's template ignoring the hash
    label (MCM's ``EqualIgnoreHash``): the "new" MachineSet of a rollout, the only one otherwise."""
    name = deployment.get("metadata", {}).get("name")
    wanted = _without_hash(deployment.get("spec", {}).get("template") or {})
    for machine_set in machine_sets:
        if controller_owner(machine_set, "MachineDeployment") != name:
            continue
        if _without_hash(machine_set.get("spec", {}).get("template") or {}) == wanted:
            return machine_set
    return None


def class_name(machine_set: Mapping[str, Any]) -> str:
    klass = machine_set.get("spec", {}).get("template", {}).get("spec", {}).get("class") or {}
    name = klass.get("name")
    if not isinstance(name, str) or not name:
        raise DesiredStateError(
            "NoDesiredState", f"MachineSet {machine_set['metadata']['name']} names no MachineClass"
        )
    return name
