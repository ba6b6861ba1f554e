"""Issue #28's MCM proof: the real machine-controller-manager v0.62.1 rolls out in place a MachineDeployment
whose AWS MachineClass changes only ``providerSpec.tags``; our agent, as the node-side updater, sets the
new tags on each Machine's instance through the AWS API (boto3) with the class's credentials Secret,
once per instance, keeping the tags someone else set, and answers each Node successful. The AWS API stops
answering mid-rollout: the Node then handed over is answered failed and retrying (no credential in it,
MCM shows it on the Machine), and once the API answers again the rollout completes.

Real: MCM's controllers and its machine-controller library, the apiserver, the agent and its boto3 calls,
moto's own server (its EC2 API over HTTP on 127.0.0.1: nothing stubbed between the agent and it), Ansible
and SSH to the lab hosts. Stand-ins: moto for AWS (its instances run nothing); the lab hosts for the
instances' operating systems, each Machine backed by one through the static-hosts driver with a moto
instance's ID as its providerID (``aws:///<zone>/<instance-id>``, the driver's per-host providerID). The
MachineClass is AWS-shaped for the agent (``provider: AWS``, ``credentialsSecretRef``, ``providerSpec``
``region`` and ``tags``), but no AWS driver creates the machines: MCM's machine controller runs the one
driver it was built with (static-hosts, which ignores those fields; MCM picks no driver by ``provider``).
Kubelets are kwok's. The outage is moto's process stopped (SIGSTOP) and continued (SIGCONT): the port
still accepts connections and answers nothing, as a hung endpoint does, so the agent's call ends at its
read timeout (20 s, ``aws/ec2_tags.py``); moto's state in memory (the instances, their tags) is kept,
which a restart of the server would lose.

Runtime: about 2.5-3 minutes in the MCM unit (measured: the test 105-142 s at load average 8-12, the
outage's read timeout about 20 s of it; its pool's creation and removal about 40 s).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aws.moto import MotoServer, moto_server
from aws.test_ec2_tags import CREDENTIALS, REGION, SECRET, ec2, instance, tags_of, volumes_of
from hostlab.lab import Host
from kubelab import objects
from kubelab.flavours import mcm, mcm_objects
from kubelab.lab import Lab

from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.aws_tags import LAST_APPLIED_ANNOTATION, last_applied

from .agentproc import Pool
from .conftest import StartAgent
from .rollout_state import RERUN_ON_MOVE_RACE, wait_on_mcm
from .test_mcm_rollout import ROLLOUT, V1, node_events, watch_rollout

pytestmark = [pytest.mark.kube, pytest.mark.mcm, pytest.mark.lab, RERUN_ON_MOVE_RACE]

CREDENTIALS_SECRET = "aws-tags-credentials"
FOREIGN = {"owner": "someone-else"}  # set outside the MachineClass: must survive
OLD_TAGS = {"team": "blue", "cost-center": "42"}  # what the instances were created with (v1's tags)
NEW_TAGS = {"team": "green", "cost-center": "42", "stage": "prod"}  # v2: one changed, one added
SEEN = 300.0  # the Node handed over during the outage is answered failed within this


def credentials_secret() -> dict[str, Any]:
    """The MachineClass's credentials, under the keys Gardener's AWS provider reads."""
    data = {
        "providerAccessKeyId": base64.b64encode(CREDENTIALS.access_key_id.encode()).decode(),
        "providerSecretAccessKey": base64.b64encode(SECRET.encode()).decode(),
    }
    metadata = {"name": CREDENTIALS_SECRET, "namespace": mcm.NAMESPACE}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data}


def aws_class(version: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """An AWS MachineClass as the agent reads it; v1 and v2 differ only in ``tags``."""
    tags = OLD_TAGS if version == "v1" else NEW_TAGS
    provider_spec = {"inPlaceUpdate": dict(spec), "region": REGION, "tags": tags}
    return mcm_objects.machine_class(
        name, provider_spec, provider="AWS", credentials_secret=CREDENTIALS_SECRET
    )


def provider_id(endpoint: str, instance_id: str) -> str:
    """The providerID MCM's AWS driver gives a Machine: aws:///<zone>/<instance id>."""
    reservations = ec2(endpoint).describe_instances(InstanceIds=[instance_id])["Reservations"]
    zone = reservations[0]["Instances"][0]["Placement"]["AvailabilityZone"]
    return f"aws:///{zone}/{instance_id}"


def create_tags_naming(moto: MotoServer, resource: str) -> int:
    """How many CreateTags requests moto received that name ``resource``."""
    return sum(
        1
        for params in moto.requests("CreateTags")
        if any(k.startswith("ResourceId.") and v == [resource] for k, v in params.items())
    )


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoServer]:
    with moto_server(tmp_path / "moto.log", record=True) as server:
        yield server


@pytest.fixture
def tagged_pool(
    kubelab_mcm: Lab, nodes: list[Host], moto: MotoServer
) -> Iterator[tuple[Pool, dict[str, str]]]:
    """A pool of the lab hosts on an AWS class, each Machine on a moto instance; yields it and each
    Node's instance id."""
    instances = {host.name: instance(moto.url, {"Name": host.name, **FOREIGN, **OLD_TAGS}) for host in nodes}
    ids = {name: provider_id(moto.url, each) for name, each in instances.items()}
    objects.apply(kubelab_mcm, credentials_secret())
    try:
        pool = Pool(
            kubelab_mcm, "tagged", nodes, {"v1": V1, "v2": V1}, provider_ids=ids, make_class=aws_class
        )
        try:
            yield pool, {name: instances[pool.host_of(pool.node(name)).name] for name in pool.initial}
        finally:
            pool.delete()
    finally:  # MCM's machine controller reads the class's credentials Secret until its Machines are gone
        kubelab_mcm.kubectl("delete", "secret", CREDENTIALS_SECRET, "-n", mcm.NAMESPACE, "--wait=false")


def test_a_tags_only_class_change_tags_each_instance_once_and_survives_an_api_outage(
    kubelab_mcm: Lab, tagged_pool: tuple[Pool, dict[str, str]], moto: MotoServer, start_agent: StartAgent
) -> None:
    pool, instance_of = tagged_pool
    for machine in pool.machines():  # MCM took the driver's providerID: each Machine names its instance
        name = machine["metadata"]["name"]
        assert machine["spec"]["providerID"] == provider_id(moto.url, instance_of[name])
        assert pool.node(name)["spec"]["providerID"] == machine["spec"]["providerID"]
    agent = start_agent(env={"AWS_ENDPOINT_URL_EC2": moto.url})
    pool.switch("v2")

    def recorded() -> list[str]:  # the Nodes whose instance the agent has tagged
        return [n for n in pool.initial if LAST_APPLIED_ANNOTATION in ns.node_annotations(pool.node(n))]

    def retrying() -> str | None:  # the Node answered failed because the API did not answer
        for name in pool.initial:
            reason = ns.node_annotations(pool.node(name)).get(ns.FAILED_REASON_ANNOTATION, "")
            if reason.startswith("AwsTagsRetriable: "):
                return str(name)
        return None

    def machine_says(name: str, text: str) -> bool:
        machine = next(m for m in pool.machines() if m["metadata"]["name"] == name)
        return text in str(machine.get("status", {}).get("lastOperation", {}).get("description", ""))

    wait_on_mcm(pool, lambda: bool(recorded()), ROLLOUT, "the first Node's instance is tagged", [agent], 0.2)
    (first,) = recorded()
    with moto.outage():
        handed = lambda: retrying() is not None  # noqa: E731
        wait_on_mcm(pool, handed, SEEN, "the Node handed over in the outage is retried", [agent], 0.25)
        second = retrying()
        assert second is not None and second != first
        node = pool.node(second)
        reason = ns.node_annotations(node)[ns.FAILED_REASON_ANNOTATION]
        assert reason == (
            f"AwsTagsRetriable: the AWS API could not be reached for instance {instance_of[second]} in "
            f"{REGION}: retriable"
        )
        assert ns.node_labels(node)[ns.RESULT_LABEL] == ns.FAILED
        assert ns.CLAIM_ANNOTATION in ns.node_annotations(node), "not final: the agent keeps the Node"
        assert ns.ANSWERED_ANNOTATION not in ns.node_annotations(node)
        wait_on_mcm(pool, lambda: machine_says(second, reason), 60, "MCM shows it on the Machine", [agent])
    watch_rollout(pool, pool.finished, agents=[agent])

    assert sorted(m["metadata"]["name"] for m in pool.machines()) == pool.initial, "none replaced"
    for name, instance_id in instance_of.items():
        host = pool.host_of(pool.node(name)).name
        assert tags_of(moto.url, instance_id) == {"Name": host, **FOREIGN, **NEW_TAGS}, "foreign tags kept"
        (volume,) = volumes_of(moto.url, instance_id)
        # the whole set (issue 39: a volume attached since, or one whose tag was removed, carries it too)
        assert tags_of(moto.url, volume) == NEW_TAGS, "the class's tags on the volume"
        assert create_tags_naming(moto, instance_id) == 1, f"{name}: its instance tagged once"
        assert last_applied(ns.node_annotations(pool.node(name))) == NEW_TAGS
        applied = [e for e in node_events(kubelab_mcm, name) if e[1] == "InPlaceTagsApplied"]
        assert applied == [
            ("Normal", "InPlaceTagsApplied", f"tags of instance {instance_id}: 2 set, 0 removed")
        ]
    assert moto.requests("DeleteTags") == [], "nothing of v1's is gone from v2: nothing deleted"
    said = f"node {second}: update-result="
    answers = [line.split(said, 1)[1].strip() for line in agent.log().splitlines() if said in line]
    assert answers[0] == f"{ns.FAILED} {reason}" and answers[-1] == ns.SUCCESSFUL, answers
    scrape = agent.get("/metrics").text
    assert f'inplace_extension_mcm_update_results_total{{result="successful"}} {len(pool.hosts)}.0' in scrape
    shown = [agent.log(), *(repr(pool.node(n)) for n in pool.initial), repr(pool.machines())]
    shown += [repr(node_events(kubelab_mcm, n)) for n in pool.initial]
    assert not any(SECRET in text or CREDENTIALS.access_key_id in text for text in shown), "no credential"
