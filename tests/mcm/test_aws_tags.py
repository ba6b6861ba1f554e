"""What the agent reads for an AWS MachineClass's tags (mcm/aws_tags.py): the target, the credentials
Secret, the Node's record; errors name fields and Secrets, never values."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from inplace_extension.mcm.aws_tags import (
    LAST_APPLIED_ANNOTATION,
    credentials_of,
    last_applied,
    record_value,
    tags_target,
)
from inplace_extension.mcm.desired import DesiredStateError

CLASS: dict[str, Any] = {
    "provider": "AWS",
    "metadata": {"name": "pool-v2", "namespace": "shoot"},
    "credentialsSecretRef": {"name": "cloud", "namespace": "shoot"},
    "providerSpec": {"region": "eu-west-1", "tags": {"team": "blue"}},
}
MACHINE: dict[str, Any] = {"metadata": {"name": "m1"}, "spec": {"providerID": "aws:///eu-west-1a/i-0abc123"}}


def test_the_target_of_an_aws_machine_class() -> None:
    target = tags_target(CLASS, MACHINE)
    assert target is not None
    assert (target.instance_id, target.region, dict(target.tags)) == (
        "i-0abc123",
        "eu-west-1",
        {"team": "blue"},
    )
    assert (target.secret_namespace, target.secret_name) == ("shoot", "cloud")
    other = tags_target(
        {**CLASS, "providerSpec": {"region": "eu-west-1", "tags": {"team": "green"}}}, MACHINE
    )
    assert other is not None and other.digest != target.digest  # a tags-only change is a new desired state


def test_other_machine_classes_have_no_target() -> None:
    assert tags_target({**CLASS, "provider": "Metal"}, MACHINE) is None
    assert tags_target({**CLASS, "providerSpec": {"region": "eu-west-1"}}, MACHINE) is None


@pytest.mark.parametrize(
    ("machine_class", "machine", "message"),
    [
        (CLASS, {"metadata": {"name": "m1"}, "spec": {}}, "Machine m1 has no providerID of the form aws:///"),
        (
            CLASS,
            {"metadata": {"name": "m1"}, "spec": {"providerID": "gce://p/z/n"}},
            "Machine m1 has no providerID",
        ),
        (
            {**CLASS, "credentialsSecretRef": None},
            MACHINE,
            "MachineClass pool-v2 has no credentialsSecretRef",
        ),
        (
            {**CLASS, "providerSpec": {"tags": {"a": "b"}}},
            MACHINE,
            "MachineClass pool-v2 providerSpec.region",
        ),
        (
            {**CLASS, "providerSpec": {"region": "r", "tags": {"a": 1}}},
            MACHINE,
            "providerSpec.tags: must map",
        ),
    ],
)
def test_a_malformed_desired_state_names_the_field(
    machine_class: dict[str, Any], machine: dict[str, Any], message: str
) -> None:
    with pytest.raises(DesiredStateError, match=message.replace("(", r"\(")):
        tags_target(machine_class, machine)


def test_credentials_from_either_pair_of_keys_and_errors_without_values() -> None:
    target = tags_target(CLASS, MACHINE)
    assert target is not None

    def secret(**data: str) -> dict[str, Any]:
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}

    assert credentials_of(secret(providerAccessKeyId="AK", providerSecretAccessKey="S3CR3T"), target) == (
        "AK",
        "S3CR3T",
    )
    assert credentials_of(secret(accessKeyID="AK", secretAccessKey="S3CR3T"), target) == ("AK", "S3CR3T")
    with pytest.raises(DesiredStateError) as raised:
        credentials_of(secret(providerAccessKeyId="AK"), target)
    assert str(raised.value) == (
        "InvalidDesiredState: Secret shoot/cloud has no providerAccessKeyId+providerSecretAccessKey or "
        "accessKeyID+secretAccessKey"
    )
    with pytest.raises(DesiredStateError, match=r"Secret shoot/cloud .* does not exist"):
        credentials_of(None, target)


def test_the_nodes_record_round_trips_and_a_bad_one_counts_as_none() -> None:
    assert last_applied({LAST_APPLIED_ANNOTATION: record_value({"b": "2", "a": "1"})}) == {"a": "1", "b": "2"}
    assert last_applied({LAST_APPLIED_ANNOTATION: "not json"}) == {}
    assert last_applied({}) == {}


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        (
            {"aws:cloudformation:stack": "x"},
            "tag 'aws:cloudformation:stack': the prefix aws: is reserved for AWS",
        ),
        ({"AWS:Team": "x"}, "tag 'AWS:Team': the prefix aws: is reserved for AWS"),
        ({f"k{i}": "v" for i in range(51)}, "has 51 tags: EC2 takes at most 50 per resource"),
        ({"k" * 129: "v"}, "the key has 129 characters, EC2 takes at most 128"),
        ({"team": "v" * 257}, "tag 'team': the value has 257 characters, EC2 takes at most 256"),
    ],
)
def test_tags_ec2_would_refuse_are_refused_up_front_naming_the_key(
    tags: dict[str, str], message: str
) -> None:
    """Issue 39: said as the desired state's error (a final answer naming the MachineClass and the key),
    not found out when CreateTags fails and the rollout stalls."""
    spec = {"region": "eu-west-1", "tags": tags}
    with pytest.raises(DesiredStateError) as info:
        tags_target({**CLASS, "providerSpec": spec}, MACHINE)
    assert info.value.reason == "InvalidDesiredState"
    assert str(info.value).startswith("InvalidDesiredState: MachineClass pool-v2 providerSpec.tags: ")
    assert message in str(info.value)
    assert "v" * 257 not in str(info.value)  # a value is never shown


def test_the_limits_themselves_are_accepted() -> None:
    tags = {f"k{i}": "v" for i in range(48)} | {"k" * 128: "v" * 256, "team-aws:x": "y"}
    assert tags_target({**CLASS, "providerSpec": {"region": "eu-west-1", "tags": tags}}, MACHINE) is not None
