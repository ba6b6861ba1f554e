"""The core's own verdicts agree with what CAPI concludes from its patches, over many mixed changes.

Seeded random combinations of claimable, guarded and unclaimable changes (no hypothesis needed): whenever
the decision says "fully claimed", CAPI must update in place, and otherwise every field CAPI still sees
as different must be one the decision reported as unclaimed, and vice versa.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from typing import Any

import pytest

from inplace_extension.inplace.pointers import is_under

from .support import bootstrap_spec, decide_and_emulate, load, machine_spec, unchanged

Mutation = Callable[[dict[str, Any], random.Random], None]


def _version(request: dict[str, Any], rng: random.Random) -> None:
    machine_spec(request, "desired")["version"] = rng.choice(
        ["v1.30.3", "v1.31.2", "v1.32.0", "v1.29.9", "bad"]
    )


def _etcd(request: dict[str, Any], rng: random.Random) -> None:
    cluster = bootstrap_spec(request, "desired").setdefault("clusterConfiguration", {})
    cluster.setdefault("etcd", {}).setdefault("local", {})["imageTag"] = rng.choice(["3.5.15-0", "3.5.16-0"])


def _feature_gates(request: dict[str, Any], rng: random.Random) -> None:
    bootstrap_spec(request, "desired").setdefault("clusterConfiguration", {})["featureGates"] = {
        "G": rng.random() < 0.5
    }


def _files(request: dict[str, Any], rng: random.Random) -> None:
    choice = rng.choice(["add", "drop", "secret", "binary", "relative", "empty", "append"])
    spec = bootstrap_spec(request, "desired")
    files = spec.setdefault("files", [])
    if choice == "add":
        files.append({"path": f"/etc/x{rng.randrange(9)}", "content": "text\n"})
    elif choice == "drop":
        spec.pop("files")
    elif choice == "secret":
        files.append({"path": "/etc/s", "contentFrom": {"secret": {"name": "n", "key": "k"}}})
    elif choice == "binary":
        files.append(
            {"path": "/etc/b", "encoding": "base64", "content": base64.b64encode(b"\xff\xfe").decode()}
        )
    elif choice == "relative":
        files.append({"path": "etc/r", "content": "x"})
    elif choice == "empty":
        spec["files"] = []
    else:
        files.append({"path": "/etc/hosts", "content": "1.2.3.4 h\n", "append": True})


def _users(request: dict[str, Any], rng: random.Random) -> None:
    users = [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"]}]
    if rng.random() < 0.3:
        users.append({"name": "vault", "passwdFrom": {"secret": {"name": "n", "key": "k"}}})  # type: ignore[dict-item]
    bootstrap_spec(request, "desired")["users"] = users


def _ntp(request: dict[str, Any], rng: random.Random) -> None:
    bootstrap_spec(request, "desired")["ntp"] = {
        "servers": ["time.example.org"],
        "enabled": rng.random() < 0.8,
    }


def _kubelet_args(request: dict[str, Any], rng: random.Random) -> None:
    node = (
        bootstrap_spec(request, "desired")
        .setdefault("joinConfiguration", {})
        .setdefault("nodeRegistration", {})
    )
    node["kubeletExtraArgs"] = rng.choice(
        [[], [{"name": "max-pods", "value": "110"}], [{"name": "v", "value": "a\nb"}]]
    )


def _pre_commands(request: dict[str, Any], rng: random.Random) -> None:
    bootstrap_spec(request, "desired")["preKubeadmCommands"] = ["echo " + str(rng.randrange(9))]


def _infra(request: dict[str, Any], rng: random.Random) -> None:
    objects = request["desired"]
    infra = objects.get("infrastructureMachineTemplate") or objects["infrastructureMachine"]
    spec = infra["spec"]["template"]["spec"] if "template" in infra["spec"] else infra["spec"]
    spec["customImage"] = "kindest/node:v1.31." + str(rng.randrange(9))


def _failure_domain(request: dict[str, Any], rng: random.Random) -> None:
    machine_spec(request, "desired")["failureDomain"] = rng.choice(["fd1", "fd2", ""])


def _ignored(request: dict[str, Any], rng: random.Random) -> None:
    machine_spec(request, "desired")["taints"] = [
        {"key": "k" + str(rng.randrange(3)), "effect": "NoSchedule"}
    ]


MUTATIONS: tuple[Mutation, ...] = (
    _version,
    _etcd,
    _feature_gates,
    _files,
    _users,
    _ntp,
    _kubelet_args,
    _pre_commands,
    _infra,
    _failure_domain,
    _ignored,
)


@pytest.mark.parametrize(
    "base", ["capi/can_update_machine/4A.request.json", "capi/can_update_machine_set/5A.request.json"]
)
@pytest.mark.parametrize("seed", range(100))
def test_decision_agrees_with_capi_on_mixed_changes(base: str, seed: int) -> None:
    rng = random.Random(seed)
    request = unchanged(load(base))
    for mutation in rng.sample(MUTATIONS, rng.randint(1, 3)):
        mutation(request, rng)
    decision, result = decide_and_emulate(request)

    assert decision.fully_claimed is result.in_place
    unclaimed = {(v.target, v.pointer) for v in decision.unclaimed}
    remaining = {(d.obj + "Patch", d.pointer) for d in result.diff}
    # The emulator reports a whole new subtree at its root, the core per claimed leaf: related pointers match.
    for target, pointer in remaining:
        assert any(t == target and _related(pointer, p) for t, p in unclaimed), (target, pointer, unclaimed)
    for target, pointer in unclaimed:
        assert any(t == target and _related(pointer, p) for t, p in remaining), (target, pointer, remaining)


def _related(a: str, b: str) -> bool:
    return is_under(a, b) or is_under(b, a)
