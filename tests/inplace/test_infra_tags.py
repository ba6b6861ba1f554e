"""The table of provider-applied infrastructure tags (inplace/infra_tags.py): its facts, the guard, and
the pure judgement of the provider's last-applied annotation."""

from __future__ import annotations

import json

import pytest

from inplace_extension.inplace.infra_tags import (
    PROVIDER_TAGS,
    declined_reason,
    desired_tags,
    missing_tags,
    provider_of,
    tags_problem,
)
from inplace_extension.inplace.pointers import MISSING


def test_the_table_holds_capa_and_capz_with_the_annotations_their_controllers_write() -> None:
    rows = {(row.provider, row.kind, row.pointer, row.annotation) for row in PROVIDER_TAGS}
    assert rows == {
        ("CAPA", "AWSMachine", "/additionalTags", "sigs.k8s.io/cluster-api-provider-aws-last-applied-tags"),
        (
            "CAPZ",
            "AzureMachine",
            "/additionalTags",
            "sigs.k8s.io/cluster-api-provider-azure-last-applied-tags-vm",
        ),
    }


@pytest.mark.parametrize(
    ("api_version", "kind", "template", "provider"),
    [
        ("infrastructure.cluster.x-k8s.io/v1beta2", "AWSMachine", False, "CAPA"),
        ("infrastructure.cluster.x-k8s.io/v1beta2", "AWSMachineTemplate", True, "CAPA"),
        ("infrastructure.cluster.x-k8s.io/v1beta1", "AzureMachine", False, "CAPZ"),
        ("infrastructure.cluster.x-k8s.io/v1beta1", "AzureMachineTemplate", True, "CAPZ"),
        ("infrastructure.cluster.x-k8s.io/v1beta2", "AWSMachineTemplate", False, None),  # wrong shape
        ("infrastructure.cluster.x-k8s.io/v1beta2", "AWSMachine", True, None),
        ("example.com/v1", "AWSMachine", False, None),  # another group's kind of the same name
        ("infrastructure.cluster.x-k8s.io/v1beta1", "GCPMachine", False, None),
    ],
)
def test_rows_match_by_group_kind_and_shape(
    api_version: str, kind: str, template: bool, provider: str | None
) -> None:
    row = provider_of({"apiVersion": api_version, "kind": kind}, template)
    assert (row.provider if row else None) == provider


def test_capg_labels_are_declined_by_name_with_the_reason() -> None:
    why = declined_reason("GCPMachineTemplate", "/additionalLabels/team", template=True)
    assert why is not None and "never to a running one" in why
    assert declined_reason("GCPMachine", "/additionalLabels", template=False) == why
    assert declined_reason("GCPMachine", "/additionalLabelsX", template=False) is None
    assert declined_reason("AWSMachine", "/additionalTags", template=False) is None


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ({"a": "1"}, {"a": "2", "b": "3"}, None),
        (MISSING, {"a": "1"}, None),
        ({"a": "1", "b": "2"}, {"a": "1"}, "removes tags (b); only adding or changing tags is claimed"),
        ({"a": "1"}, MISSING, "removes every tag; only adding or changing tags is claimed"),
        ({"a": "1"}, {"a": 2}, "must be a map of strings to strings"),
        ({"a": "1"}, ["a"], "must be a map of strings to strings"),
        ("x", {"a": "1"}, "the current value is not a map of strings to strings"),
    ],
)
def test_the_guard_claims_added_and_changed_tags_only(old: object, new: object, problem: str | None) -> None:
    assert tags_problem(old, new) == problem


def test_desired_tags_of_an_update_machine_infrastructure_machine() -> None:
    obj = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "AWSMachine",
        "metadata": {"namespace": "ns", "name": "m-1"},
        "spec": {"additionalTags": {"team": "blue"}},
    }
    tags = desired_tags(obj)
    assert tags is not None
    assert (tags.provider.provider, tags.namespace, tags.name, dict(tags.tags)) == (
        "CAPA",
        "ns",
        "m-1",
        {"team": "blue"},
    )
    assert tags.api_version == "infrastructure.cluster.x-k8s.io/v1beta2"
    assert desired_tags({**obj, "spec": {}}) is None  # no tags: nothing to wait for
    assert desired_tags({**obj, "kind": "DockerMachine"}) is None
    assert desired_tags(None) is None


def test_missing_tags_compares_key_and_value_and_ignores_tags_of_the_cluster() -> None:
    desired = {"team": "blue", "env": "prod"}
    applied = {"team": "blue", "env": "prod", "cluster-wide": "yes"}  # CAPA merges the AWSCluster's tags
    assert missing_tags(desired, json.dumps(applied)) == ()
    assert missing_tags(desired, json.dumps({"team": "red", "env": "prod"})) == ("team",)
    assert missing_tags(desired, None) == ("env", "team")
    assert missing_tags(desired, "not json") == ("env", "team")
    assert missing_tags(desired, "[1]") == ("env", "team")
