"""The AWS adapter (aws/ec2_tags.py) against the real moto server: tags applied to the instance and its
volumes, foreign tags kept, one call per difference, AWS error codes classified, an outage retriable,
credentials in no message."""

from __future__ import annotations

import io
import logging
from typing import Any

import boto3
import pytest
from kubelab.ports import free_port

from inplace_extension.aws.ec2_tags import (
    RETRIABLE_CODES,
    TERMINAL_CODES,
    Credentials,
    Ec2TagsError,
    TagsApplied,
    apply_tags,
    classify,
)
from inplace_extension.logs import configure_logging

REGION = "eu-west-1"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"  # moto accepts any key; this one must never be shown
CREDENTIALS = Credentials("AKIAIOSFODNN7EXAMPLE", SECRET)


def ec2(endpoint: str) -> Any:
    return boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS.access_key_id,
        aws_secret_access_key=SECRET,
    )


def instance(endpoint: str, tags: dict[str, str]) -> str:
    """A running instance of the emulator with ``tags`` (set by someone else, e.g. MCM at creation)."""
    client = ec2(endpoint)
    image = client.describe_images()["Images"][0]["ImageId"]
    spec: dict[str, Any] = {"ImageId": image, "MinCount": 1, "MaxCount": 1, "InstanceType": "t3.micro"}
    if tags:
        spec["TagSpecifications"] = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
    return str(client.run_instances(**spec)["Instances"][0]["InstanceId"])


def tags_of(endpoint: str, resource: str) -> dict[str, str]:
    found = ec2(endpoint).describe_tags(Filters=[{"Name": "resource-id", "Values": [resource]}])["Tags"]
    return {t["Key"]: t["Value"] for t in found}


def volumes_of(endpoint: str, instance_id: str) -> list[str]:
    reservations = ec2(endpoint).describe_instances(InstanceIds=[instance_id])["Reservations"]
    mappings = reservations[0]["Instances"][0]["BlockDeviceMappings"]
    return [m["Ebs"]["VolumeId"] for m in mappings]


def test_tags_are_applied_to_the_instance_and_its_volumes(ec2_endpoint: str) -> None:
    instance_id = instance(ec2_endpoint, {"Name": "node-1"})
    applied = apply_tags(CREDENTIALS, REGION, instance_id, {"team": "blue", "cost": "42"}, {})
    assert applied == TagsApplied({"team": "blue", "cost": "42"}, ())
    assert tags_of(ec2_endpoint, instance_id) == {"Name": "node-1", "team": "blue", "cost": "42"}
    [volume] = volumes_of(ec2_endpoint, instance_id)
    assert tags_of(ec2_endpoint, volume) == {"team": "blue", "cost": "42"}
    # applied already: nothing is sent again
    assert apply_tags(CREDENTIALS, REGION, instance_id, {"team": "blue", "cost": "42"}, {}) == TagsApplied(
        {}, ()
    )


def test_volumes_get_the_whole_tag_set_not_only_the_difference(ec2_endpoint: str) -> None:
    """Issue 39: a volume that lacks a tag the instance has already (attached since, or its tag removed
    by someone) gets it at the next application, as the instance carries the whole set."""
    instance_id = instance(ec2_endpoint, {"team": "blue"})  # the instance has team already, its volume not
    [volume] = volumes_of(ec2_endpoint, instance_id)
    assert tags_of(ec2_endpoint, volume) == {}
    applied = apply_tags(CREDENTIALS, REGION, instance_id, {"team": "blue", "cost": "42"}, {"team": "blue"})
    assert applied == TagsApplied({"cost": "42"}, ())  # the instance: only its difference
    assert tags_of(ec2_endpoint, volume) == {"team": "blue", "cost": "42"}


def test_a_tag_set_ec2_refuses_is_refused_before_any_call(ec2_endpoint: str) -> None:
    instance_id = instance(ec2_endpoint, {})
    with pytest.raises(Ec2TagsError) as info:
        apply_tags(CREDENTIALS, REGION, instance_id, {"aws:owner": "x"}, {})
    assert (info.value.code, info.value.retriable) == ("InvalidParameterValue", False)
    assert "tag 'aws:owner': the prefix aws: is reserved for AWS" in str(info.value)
    assert tags_of(ec2_endpoint, instance_id) == {}


def test_no_credential_is_logged_at_the_debug_level(ec2_endpoint: str) -> None:
    """Issue 39: with --log-level debug, botocore would log each signed request's headers (the access key
    id in the Authorization header) and the SDK's credential lookups."""
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("boto3", "botocore", "urllib3")}
    try:
        configure_logging("text", "debug", stream)
        logging.getLogger("inplace_extension.test").debug("debug is on")
        instance_id = instance(ec2_endpoint, {})
        apply_tags(CREDENTIALS, REGION, instance_id, {"team": "blue"}, {})
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, old in levels.items():
            logging.getLogger(name).setLevel(old)
    output = stream.getvalue()
    assert "debug is on" in output  # the level was debug
    assert CREDENTIALS.access_key_id not in output and SECRET not in output
    assert "Authorization" not in output and "Signature=" not in output


def test_only_tags_we_set_are_removed_and_foreign_ones_are_kept(ec2_endpoint: str) -> None:
    instance_id = instance(
        ec2_endpoint, {"Name": "node-2", "owner": "someone", "old": "x", "was-ours": "changed-by-someone"}
    )
    last_applied = {"old": "x", "was-ours": "ours", "team": "blue"}
    applied = apply_tags(CREDENTIALS, REGION, instance_id, {"team": "green"}, last_applied)
    assert applied == TagsApplied({"team": "green"}, ("old",))
    assert tags_of(ec2_endpoint, instance_id) == {
        "Name": "node-2",  # never ours
        "owner": "someone",  # never ours
        "was-ours": "changed-by-someone",  # ours once, changed by someone since: theirs now
        "team": "green",
    }


def test_an_unknown_instance_is_a_terminal_error_without_the_credentials(ec2_endpoint: str) -> None:
    with pytest.raises(Ec2TagsError) as raised:
        apply_tags(CREDENTIALS, REGION, "i-0123456789abcdef0", {"team": "blue"}, {})
    assert (raised.value.code, raised.value.retriable) == ("InvalidInstanceID.NotFound", False)
    assert str(raised.value) == (
        "AWS answered InvalidInstanceID.NotFound for instance i-0123456789abcdef0 in eu-west-1: terminal"
    )
    assert SECRET not in repr(raised.value) and CREDENTIALS.access_key_id not in str(raised.value)
    assert SECRET not in repr(CREDENTIALS)


def test_an_outage_is_retriable_and_the_next_try_applies(
    ec2_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance_id = instance(ec2_endpoint, {})
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(Ec2TagsError) as raised:
        apply_tags(CREDENTIALS, REGION, instance_id, {"team": "blue"}, {})
    assert (raised.value.code, raised.value.retriable) == ("Unreachable", True)
    assert SECRET not in str(raised.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", ec2_endpoint)  # the API is back
    assert apply_tags(CREDENTIALS, REGION, instance_id, {"team": "blue"}, {}).created == {"team": "blue"}
    assert tags_of(ec2_endpoint, instance_id) == {"team": "blue"}


def test_the_error_tables_are_disjoint_and_unknown_codes_are_terminal() -> None:
    assert not RETRIABLE_CODES & TERMINAL_CODES
    assert classify("RequestLimitExceeded") and classify("InternalError") and classify("Unavailable")
    assert not classify("AuthFailure") and not classify("UnauthorizedOperation")
    assert not classify("SomethingNew")
