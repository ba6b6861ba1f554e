"""The tags of an AWS-shaped MachineClass, applied by the agent to a Node's instance: what it reads
(``providerSpec.tags`` and ``region``, the credentials Secret, the Machine's ``providerID``) and the
record it keeps on the Node of the tags it applied (the preserve rule's ``last_applied``, as CAPA keeps
its own on the AWSMachine). Pure: the agent does the reads and the AWS call
(``inplace_extension.aws.ec2_tags``).

MCM has no update call for a running instance: a MachineClass whose ``tags`` change on an in-place
MachineDeployment reaches only the node-side updater, so the agent carries it out beside the host steps.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from inplace_extension.aws.ec2_tags import tags_problem
from inplace_extension.mcm.desired import DesiredStateError

# the Node annotation holding, as JSON, the tags the agent last applied to the Node's instance
LAST_APPLIED_ANNOTATION: Final = "inplace-extension.io/aws-last-applied-tags"
AWS_PROVIDER: Final = "AWS"
# MCM's AWS provider reads either pair of keys from the Secret (the first one is Gardener's)
KEY_PAIRS: Final = (("providerAccessKeyId", "providerSecretAccessKey"), ("accessKeyID", "secretAccessKey"))
# aws:///<availability zone>/<instance id>, as MCM's AWS provider writes a Machine's providerID
_PROVIDER_ID: Final = re.compile(r"^aws:///(?P<zone>[a-z0-9-]+)/(?P<instance>i-[0-9a-f]+)$")


@dataclass(frozen=True)
class TagsTarget:
    """Where a Node's tags go: its instance, the MachineClass's tags, region and credentials Secret."""

    instance_id: str
    region: str
    tags: Mapping[str, str]
    secret_namespace: str
    secret_name: str = field(compare=True)

    @property
    def digest(self) -> str:
        """Short digest of the desired tags: part of the Node's answered key, so a tags-only change of the
        MachineClass is a new desired state although the host plan's fingerprint is the same."""
        canonical = json.dumps(dict(self.tags), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def tags_target(machine_class: Mapping[str, Any], machine: Mapping[str, Any]) -> TagsTarget | None:
    """The tags of an AWS MachineClass (``provider: AWS``) with ``providerSpec.tags``, for the Machine's
    instance; None for any other MachineClass. A malformed one is a DesiredStateError naming the field."""
    if machine_class.get("provider") != AWS_PROVIDER:
        return None
    name = (machine_class.get("metadata") or {}).get("name", "?")
    spec = machine_class.get("providerSpec")
    tags = spec.get("tags") if isinstance(spec, Mapping) else None
    if tags is None:
        return None
    if not isinstance(tags, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise DesiredStateError(
            "InvalidDesiredState", f"MachineClass {name} providerSpec.tags: must map strings to strings"
        )
    problem = tags_problem(tags)
    if problem is not None:  # said now, as the desired state's error, not at CreateTags time
        raise DesiredStateError("InvalidDesiredState", f"MachineClass {name} providerSpec.tags: {problem}")
    region = spec.get("region") if isinstance(spec, Mapping) else None
    if not isinstance(region, str) or not region:
        raise DesiredStateError(
            "InvalidDesiredState", f"MachineClass {name} providerSpec.region: must be a region"
        )
    ref = machine_class.get("credentialsSecretRef") or machine_class.get("secretRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        raise DesiredStateError(
            "InvalidDesiredState", f"MachineClass {name} has no credentialsSecretRef (or secretRef) for AWS"
        )
    machine_name = (machine.get("metadata") or {}).get("name", "?")
    provider_id = (machine.get("spec") or {}).get("providerID")
    match = _PROVIDER_ID.match(provider_id) if isinstance(provider_id, str) else None
    if match is None:
        raise DesiredStateError(
            "NoDesiredState",
            f"Machine {machine_name} has no providerID of the form aws:///<zone>/<instance-id>",
        )
    namespace = str(ref.get("namespace") or (machine_class.get("metadata") or {}).get("namespace", ""))
    return TagsTarget(match["instance"], region, dict(tags), namespace, str(ref["name"]))


def credentials_of(secret: Mapping[str, Any] | None, target: TagsTarget) -> tuple[str, str]:
    """The access key id and secret from the credentials Secret (``data``, base64); the error names the
    Secret and the keys looked for, never a value."""
    where = f"Secret {target.secret_namespace}/{target.secret_name}"
    if secret is None:
        raise DesiredStateError("NoDesiredState", f"{where} (the MachineClass's credentials) does not exist")
    data = secret.get("data") or {}
    for key_id, key_secret in KEY_PAIRS:
        if key_id in data and key_secret in data:
            try:
                return _decoded(data[key_id]), _decoded(data[key_secret])
            except (binascii.Error, UnicodeDecodeError, TypeError):
                raise DesiredStateError(
                    "InvalidDesiredState", f"{where}: {key_id}/{key_secret} are not base64 text"
                ) from None
    wanted = " or ".join(f"{a}+{b}" for a, b in KEY_PAIRS)
    raise DesiredStateError("InvalidDesiredState", f"{where} has no {wanted}")


def _decoded(value: Any) -> str:
    return base64.b64decode(str(value), validate=True).decode()


def last_applied(node_annotations: Mapping[str, str]) -> dict[str, str]:
    """The tags the agent last applied to this Node's instance (none recorded: ``{}``, nothing deleted)."""
    try:
        recorded = json.loads(node_annotations.get(LAST_APPLIED_ANNOTATION) or "{}")
    except ValueError:
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {k: v for k, v in recorded.items() if isinstance(k, str) and isinstance(v, str)}


# the Node annotation counting the retriable failures of applying the tags of one desired state:
# "<digest of the desired state's key> <count>" (another desired state, or retry token, counts afresh)
FAILURES_ANNOTATION: Final = "inplace-extension.io/aws-tags-failures"


def failures(node_annotations: Mapping[str, str], key: str) -> int:
    """How many times applying the tags of the desired state ``key`` failed retriably so far."""
    digest, _, count = (node_annotations.get(FAILURES_ANNOTATION) or "").partition(" ")
    return int(count) if digest == _digest(key) and count.isdigit() else 0


def failures_value(key: str, count: int) -> str:
    return f"{_digest(key)} {count}"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def record_value(tags: Mapping[str, str]) -> str:
    return json.dumps(dict(tags), sort_keys=True, separators=(",", ":"))
