"""The MCM agent applying an AWS MachineClass's tags to the Node's instance: the agent over the in-memory
fake of the kube ports, the AWS side the real moto server. The instance's tags are set once, foreign
tags kept, the Node keeps the record and is answered successful; an outage is answered failed and
retried until the API is back; a terminal error is a final failure; no credential is in any answer,
Event or log line."""

from __future__ import annotations

import base64
import copy
import logging
import os
from typing import Any

import pytest
from kubefake import FakeControl, FakeTarget
from kubelab.ports import free_port
from mcm.test_agent_fake import (
    NS,
    Runs,
    annotate_deployment,
    done_after,
    pool,
    result,
    running,
    until,
    waiting_node,
)

from inplace_extension.aws.ec2_tags import TagsApplied, apply_tags
from inplace_extension.mcm import agent as agent_module
from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.aws_tags import FAILURES_ANNOTATION, LAST_APPLIED_ANNOTATION, last_applied

from .test_ec2_tags import CREDENTIALS, REGION, SECRET, instance, tags_of

pytestmark = pytest.mark.anyio


def aws_pool(control: FakeControl, instance_id: str, tags: dict[str, str]) -> None:
    """The fake pool, its new MachineClass AWS-shaped with ``tags``, the Machine on ``instance_id``."""
    pool(control)
    klass = copy.deepcopy(control.objects["MachineClass"]["pool-v2"])
    klass["provider"] = "AWS"
    klass["credentialsSecretRef"] = {"name": "cloud", "namespace": NS}
    klass["providerSpec"].update(region=REGION, tags=tags, machineType="t3.micro")
    control.put(klass)
    machine = copy.deepcopy(control.objects["Machine"]["m1"])
    machine["spec"] = {"providerID": f"aws:///{REGION}a/{instance_id}"}
    control.put(machine)
    data = {
        "providerAccessKeyId": base64.b64encode(CREDENTIALS.access_key_id.encode()).decode(),
        "providerSecretAccessKey": base64.b64encode(SECRET.encode()).decode(),
    }
    control.put(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cloud", "namespace": NS}, "data": data}
    )


def reasons_and_messages(target: FakeTarget) -> str:
    return repr(target.events) + repr(target.nodes)


async def test_the_agent_tags_the_instance_once_keeps_foreign_tags_and_answers_successful(
    ec2_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    instance_id = instance(ec2_endpoint, {"Name": "n1", "owner": "someone"})
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(1))
    aws_pool(control, instance_id, {"team": "blue", "cost": "42"})
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, 60)
    assert tags_of(ec2_endpoint, instance_id) == {
        "Name": "n1",
        "owner": "someone",
        "team": "blue",
        "cost": "42",
    }
    assert last_applied(ns.node_annotations(target.nodes["n1"])) == {"team": "blue", "cost": "42"}
    assert target.reasons("n1").count("InPlaceTagsApplied") == 1  # applied once, not on every poll
    assert SECRET not in caplog.text and SECRET not in reasons_and_messages(target)


async def test_our_old_tags_in_the_record_are_removed_and_foreign_ones_kept(
    ec2_endpoint: str,
) -> None:
    instance_id = instance(ec2_endpoint, {"owner": "someone", "team": "blue"})
    target, control = FakeTarget(), FakeControl()
    aws_pool(control, instance_id, {"team": "green"})
    node = waiting_node()
    node["metadata"]["annotations"] = {LAST_APPLIED_ANNOTATION: '{"team":"blue","old":"x"}'}
    target.put_node(node)
    async for _agent in running(target, control, Runs(target, done_after(1))):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, 60)
    assert tags_of(ec2_endpoint, instance_id) == {"owner": "someone", "team": "green"}


async def test_an_outage_is_answered_failed_and_retried_until_the_api_is_back(
    ec2_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance_id = instance(ec2_endpoint, {})
    target, control = FakeTarget(), FakeControl()
    aws_pool(control, instance_id, {"team": "blue"})
    target.put_node(waiting_node())
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://127.0.0.1:{free_port()}")  # the API is down
    # a budget that outlasts the outage (the next test spends one)
    async for _agent in running(target, control, Runs(target, done_after(1)), max_failed_attempts=100):
        await until(lambda: result(target) == ns.FAILED, target.activity, 60)
        reason = ns.node_annotations(target.nodes["n1"]).get(ns.FAILED_REASON_ANNOTATION, "")
        assert reason.startswith("AwsTagsRetriable: the AWS API could not be reached"), reason
        assert ns.CLAIM_ANNOTATION in ns.node_annotations(target.nodes["n1"])  # not final: still ours
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", ec2_endpoint)  # back
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, 60)
    assert tags_of(ec2_endpoint, instance_id) == {"team": "blue"}


async def test_a_terminal_error_is_a_final_failure(ec2_endpoint: str) -> None:
    target, control = FakeTarget(), FakeControl()
    aws_pool(control, "i-0123456789abcdef0", {"team": "blue"})  # no such instance
    target.put_node(waiting_node())
    runs = Runs(target, done_after(1))
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.FAILED, target.activity, 60)
    annotations = ns.node_annotations(target.nodes["n1"])
    assert annotations[ns.FAILED_REASON_ANNOTATION] == (
        "AwsTagsFailed: AWS answered InvalidInstanceID.NotFound for instance i-0123456789abcdef0 in "
        f"{REGION}: terminal"
    )
    assert ns.ANSWERED_ANNOTATION in annotations and runs.requests == []  # final, no play


async def test_a_paused_node_gets_no_tags_until_the_pause_is_removed(ec2_endpoint: str) -> None:
    """Issue 39: the tags obey the operator's pause as a play does. The host has the desired state already
    (a tags-only change of the MachineClass: the run service answers done), and the MachineDeployment is
    paused: no CreateTags, no result, one waiting Event; once the pause is gone the tags are applied."""
    instance_id = instance(ec2_endpoint, {"owner": "someone"})
    target, control = FakeTarget(), FakeControl()
    aws_pool(control, instance_id, {"team": "blue"})
    annotate_deployment(control, "true")
    target.put_node(waiting_node())
    async for _agent in running(target, control, Runs(target, done_after(0))):
        await until(lambda: target.reasons("n1") == ["InPlaceUpdateWaiting"], target.activity, 60)
        assert tags_of(ec2_endpoint, instance_id) == {"owner": "someone"}, "no CreateTags while paused"
        assert result(target) is None
        annotate_deployment(control, "cancel")
        await until(lambda: result(target) == ns.FAILED, target.activity, 60)
        assert tags_of(ec2_endpoint, instance_id) == {"owner": "someone"}, "nor once cancelled"
        annotate_deployment(control, None)
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, 60)
    assert tags_of(ec2_endpoint, instance_id) == {"owner": "someone", "team": "blue"}
    assert "InPlaceTagsApplied" in target.reasons("n1")


async def test_retriable_errors_count_against_the_retry_budget(
    ec2_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39: an outage is retried as a play's failed attempt is, until the budget
    (--max-failed-attempts) is spent: then a final answer, blocked until the retry annotation changes."""
    instance_id = instance(ec2_endpoint, {})
    target, control = FakeTarget(), FakeControl()
    aws_pool(control, instance_id, {"team": "blue"})
    target.put_node(waiting_node())
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://127.0.0.1:{free_port()}")  # the API is down
    runs = Runs(target, done_after(0))
    async for _agent in running(target, control, runs, max_failed_attempts=2):
        await until(
            lambda: ns.ANSWERED_ANNOTATION in ns.node_annotations(target.nodes["n1"]), target.activity, 60
        )
    annotations = ns.node_annotations(target.nodes["n1"])
    assert result(target) == ns.FAILED
    assert annotations[ns.FAILED_REASON_ANNOTATION].startswith(
        "blocked after 2 failed attempts: AwsTagsRetriable: the AWS API could not be reached"
    ), annotations
    assert ns.CLAIM_ANNOTATION not in annotations  # final: released


async def test_a_node_changed_during_the_aws_call_keeps_the_count_the_record_and_the_answer(
    ec2_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In an outage the AWS call takes long (its retries) and MCM or the kubelet change the Node
    meanwhile: the failure is still counted and answered, and once the API is back the tags are
    recorded and set once, though the Node changes during every call."""
    instance_id = instance(ec2_endpoint, {})
    target, control = FakeTarget(), FakeControl()
    aws_pool(control, instance_id, {"team": "blue"})
    target.put_node(waiting_node())
    calls: list[str] = []

    def changed_meanwhile(*args: Any) -> TagsApplied:  # another writer changes the Node during the call
        node = copy.deepcopy(target.nodes["n1"])
        node["metadata"].setdefault("annotations", {})["example.com/other-writer"] = str(len(calls))
        target.put_node(node)
        calls.append(os.environ["AWS_ENDPOINT_URL_EC2"])
        return apply_tags(*args)

    monkeypatch.setattr(agent_module, "apply_tags", changed_meanwhile)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://127.0.0.1:{free_port()}")  # the API is down
    async for _agent in running(target, control, Runs(target, done_after(0)), max_failed_attempts=100):
        await until(lambda: result(target) == ns.FAILED, target.activity, 60)
        annotations = ns.node_annotations(target.nodes["n1"])
        assert annotations[ns.FAILED_REASON_ANNOTATION].startswith("AwsTagsRetriable: "), annotations
        assert FAILURES_ANNOTATION in annotations, "the failure counted against the retry budget"
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", ec2_endpoint)  # back
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, 60)
    assert tags_of(ec2_endpoint, instance_id) == {"team": "blue"}
    assert last_applied(ns.node_annotations(target.nodes["n1"])) == {"team": "blue"}
    assert calls.count(ec2_endpoint) == 1, "the tags set once: their record was not lost to the change"
    assert target.reasons("n1").count("InPlaceTagsApplied") == 1
