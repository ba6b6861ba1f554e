"""The MCM desired state: schema, the CAPI-shaped objects it becomes, the same plan as UpdateMachine,
and the choice of the current MachineSet (EqualIgnoreHash)."""

from __future__ import annotations

from typing import Any

import pytest

from inplace_extension.inplace.custom import CustomCapability, CustomClaim, CustomTable
from inplace_extension.inplace.plan import plan_update
from inplace_extension.mcm.desired import (
    DesiredStateError,
    class_name,
    controller_owner,
    current_machine_set,
    parse_spec,
    plan_for,
)

MOTD = "hello $(reboot) `id` ${HOME}\n"
KUBEADM: dict[str, Any] = {
    "files": [{"path": "/etc/motd", "content": MOTD}],
    "ntp": {"enabled": True, "servers": ["0.pool.ntp.org"]},
    "users": [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA ops"]}],
    "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "max-pods", "value": "50"}]}},
}


def machine_class(spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pool-v2"}, "providerSpec": {"inPlaceUpdate": spec}}


def test_spec_becomes_the_same_plan_as_an_update_machine_request() -> None:
    spec = parse_spec(machine_class({"kubernetesVersion": "v1.31.0", "kubeadmConfigSpec": KUBEADM}))
    plan = plan_for(spec, "machines", "node-a")
    assert plan.capabilities == ("users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version")
    assert (plan.namespace, plan.name) == ("machines", "node-a")
    update_machine = {  # the same desired values as an UpdateMachine request carries them
        "machine": {
            "kind": "Machine",
            "metadata": {"namespace": "machines", "name": "node-a"},
            "spec": {"version": "v1.31.0"},
        },
        "bootstrapConfig": {
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmConfig",
            "spec": KUBEADM,
        },
    }
    assert plan == plan_update(update_machine)
    files = plan.inputs["kubeadm_files"]["kubeadm_files_files"]
    assert files[0]["content"] == MOTD, "file content is data, kept literally"


def test_fingerprint_follows_the_desired_values_only() -> None:
    one = plan_for(parse_spec(machine_class({"kubernetesVersion": "v1.31.0"})), "machines", "a")
    other_node = plan_for(parse_spec(machine_class({"kubernetesVersion": "v1.31.0"})), "machines", "b")
    newer = plan_for(parse_spec(machine_class({"kubernetesVersion": "v1.31.1"})), "machines", "a")
    assert one.fingerprint == other_node.fingerprint != newer.fingerprint


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (None, "NoDesiredState"),
        ({"kubernetesVersion": "v1.31.0", "surprise": 1}, "surprise"),
        ({"kubeadmConfigSpec": "not an object"}, "kubeadmConfigSpec"),
        ({"infrastructure": {"spec": {}}}, "infrastructure.kind"),
    ],
)
def test_schema_errors_name_the_field(raw: Any, needle: str) -> None:
    klass = {"metadata": {"name": "c"}, "providerSpec": {} if raw is None else {"inPlaceUpdate": raw}}
    with pytest.raises(DesiredStateError) as caught:
        parse_spec(klass)
    assert needle in str(caught.value)


def test_plan_errors_name_provider_spec_paths() -> None:
    with pytest.raises(DesiredStateError) as caught:
        plan_for(parse_spec(machine_class({"kubernetesVersion": "1.31"})), "machines", "a")
    assert "providerSpec.inPlaceUpdate.kubernetesVersion" in str(caught.value)
    bad_file = {"kubeadmConfigSpec": {"files": [{"path": "relative", "content": "x"}]}}
    with pytest.raises(DesiredStateError) as caught:
        plan_for(parse_spec(machine_class(bad_file)), "machines", "a")
    assert "providerSpec.inPlaceUpdate.kubeadmConfigSpec.files[0]" in str(caught.value)


def owned(name: str, deployment: str, template: dict[str, Any]) -> dict[str, Any]:
    ref = {"kind": "MachineDeployment", "name": deployment, "controller": True}
    return {"metadata": {"name": name, "ownerReferences": [ref]}, "spec": {"template": template}}


def template(klass: str, template_hash: str | None = None) -> dict[str, Any]:
    labels = {"name": "pool"} | ({"machine-template-hash": template_hash} if template_hash else {})
    return {"metadata": {"labels": labels}, "spec": {"class": {"kind": "MachineClass", "name": klass}}}


def test_current_machine_set_is_the_one_matching_the_deployment_template() -> None:
    deployment = {"metadata": {"name": "pool"}, "spec": {"template": template("pool-v2")}}
    old = owned("pool-1", "pool", template("pool-v1", "1"))
    new = owned("pool-2", "pool", template("pool-v2", "2"))
    stranger = owned("other-2", "other", template("pool-v2", "2"))
    assert current_machine_set(deployment, [stranger, old, new]) is new
    assert current_machine_set(deployment, [old]) is None
    assert class_name(new) == "pool-v2"
    assert controller_owner(new, "MachineDeployment") == "pool"
    assert controller_owner(new, "MachineSet") is None


def test_user_defined_capabilities_read_the_infrastructure_object() -> None:
    os_image = CustomCapability(
        "os_image", "os_image_role", "/srv/roles", (CustomClaim("Metal3Machine", "/image/url"),)
    )
    spec = parse_spec(
        machine_class(
            {"infrastructure": {"kind": "Metal3Machine", "spec": {"image": {"url": "http://i/os-2"}}}}
        )
    )
    plan = plan_for(spec, "machines", "a", CustomTable((os_image,)))
    assert plan.capabilities == ("os_image",)
    assert plan.inputs["os_image"] == {"os_image_values": {"/image/url": "http://i/os-2"}}
    assert plan.steps[0].role == "os_image_role"


@pytest.mark.parametrize(
    ("kubeadm", "where"),
    [
        (
            {
                "files": [
                    {"path": "/a", "content": "x"},
                    {"path": "/b", "content": "id={{ ds.meta_data.uuid }}"},
                ]
            },
            "kubeadmConfigSpec.files[1]",
        ),
        (
            {
                "joinConfiguration": {
                    "nodeRegistration": {"kubeletExtraArgs": [{"name": "n", "value": "{%x%}"}]}
                }
            },
            "kubeadmConfigSpec.joinConfiguration.nodeRegistration.kubeletExtraArgs",
        ),
    ],
)
def test_cloud_init_templates_are_refused_not_left_out(kubeadm: dict[str, Any], where: str) -> None:
    with pytest.raises(DesiredStateError) as caught:
        plan_for(parse_spec(machine_class({"kubeadmConfigSpec": kubeadm})), "machines", "a")
    assert f"providerSpec.inPlaceUpdate.{where} holds a cloud-init template" in str(caught.value)
