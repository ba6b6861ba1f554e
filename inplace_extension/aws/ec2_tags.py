"""An EC2 instance's tags set to a desired map through the AWS API (boto3), keeping every tag someone
else set, and AWS's error codes sorted into retriable and terminal.

The preserve rule (the same as CAPA's ``ensureTags``): only tags named by the desired map are created or
changed, and only tags the last application set (``last_applied``) and the desired map no longer names
are deleted, each only while it still holds the value we set. Every other tag of the instance is never
touched. The instance's attached EBS volumes get the whole desired set (a volume attached since, or
tagged by someone else, ends with the class's tags too) and the same deleted tags.

What EC2 refuses of a tag set (:func:`tags_problem`: the ``aws:`` prefix, more than 50 tags on a
resource, a key over 128 or a value over 256 characters) is said before any call, naming the key.

Credentials reach boto3 only as arguments of its session: they are never part of a message, an
exception or a log line (:class:`Credentials` hides them from ``repr``). The endpoint is boto3's own
setting (``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL``), so the tests point it at an AWS API emulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# AWS error codes (EC2's API reference, "Common client errors" and "Server errors") that go away by
# themselves: throttling and the service's own trouble. Retried by the caller.
RETRIABLE_CODES: Final = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "EC2ThrottledException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
# Codes that no retry fixes: credentials, permissions, the instance, the request itself. Any code in
# neither table is terminal too (said so in the message): a retry loop on an error nobody has classified
# would hide it.
TERMINAL_CODES: Final = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "OptInRequired",
        "Blocked",
        "InvalidInstanceID.NotFound",
        "InvalidInstanceID.Malformed",
        "InvalidID",
        "InvalidParameterValue",
        "TagLimitExceeded",
    }
)
# one attempt per call (the caller's poll is the retry, with its own pace); short timeouts: an outage
# answers a retriable error in seconds instead of holding the agent's step
_CONFIG: Final[dict[str, Any]] = {
    "retries": {"max_attempts": 1, "mode": "standard"},
    "connect_timeout": 5,
    "read_timeout": 20,
}


# EC2's limits of user tags ("Tag restrictions", EC2 user guide): AWS reserves the aws: prefix
MAX_TAGS: Final = 50
MAX_KEY_LENGTH: Final = 128
MAX_VALUE_LENGTH: Final = 256
RESERVED_PREFIX: Final = "aws:"


def tags_problem(tags: Mapping[str, str]) -> str | None:
    """Why EC2 would refuse ``tags`` on a resource (naming the key, never a value), or None."""
    if len(tags) > MAX_TAGS:
        return f"has {len(tags)} tags: EC2 takes at most {MAX_TAGS} per resource"
    for key, value in sorted(tags.items()):
        if key.lower().startswith(RESERVED_PREFIX):
            return f"tag {key!r}: the prefix {RESERVED_PREFIX} is reserved for AWS"
        if not key:
            return "a tag has an empty key"
        if len(key) > MAX_KEY_LENGTH:
            shown = f"{key[:40]!r}..."
            return f"tag {shown}: the key has {len(key)} characters, EC2 takes at most {MAX_KEY_LENGTH}"
        if len(value) > MAX_VALUE_LENGTH:
            return f"tag {key!r}: the value has {len(value)} characters, EC2 takes at most {MAX_VALUE_LENGTH}"
    return None


@dataclass(frozen=True)
class Credentials:
    """An access key from the MachineClass's credentials Secret; ``repr`` shows neither part."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)


class Ec2TagsError(Exception):
    """The AWS API refused or could not be reached; ``code`` is AWS's error code (or ``Unreachable``)
    and the message is ours, never AWS's text (which may echo a request's parts)."""

    def __init__(self, code: str, retriable: bool, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable


@dataclass(frozen=True)
class TagsApplied:
    """What one application did: the tags created or changed and the keys deleted (empty: nothing)."""

    created: Mapping[str, str]
    deleted: tuple[str, ...]


def classify(code: str) -> bool:
    """True when an AWS error ``code`` is retriable (see the two tables)."""
    return code in RETRIABLE_CODES


def apply_tags(
    credentials: Credentials,
    region: str,
    instance_id: str,
    desired: Mapping[str, str],
    last_applied: Mapping[str, str],
) -> TagsApplied:
    """Make the instance (and its volumes) carry ``desired``, deleting what ``last_applied`` set that
    ``desired`` no longer names; other tags are kept. The instance gets CreateTags/DeleteTags only for a
    difference, its volumes the whole desired set. Raises :class:`Ec2TagsError` (a set EC2 would refuse:
    before any call)."""
    # imported on first use: half a second of CPU that every command importing this module (each one
    # of the CLI, the ``attempt`` in every Job among them) would pay otherwise
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    what = f"instance {instance_id} in {region}"
    problem = tags_problem(desired)
    if problem is not None:
        raise Ec2TagsError("InvalidParameterValue", False, f"the tags for {what}: {problem}")
    try:
        client: Any = boto3.session.Session(
            aws_access_key_id=credentials.access_key_id,
            aws_secret_access_key=credentials.secret_access_key,
            region_name=region,
        ).client("ec2", config=Config(**_CONFIG))
        reservations = client.describe_instances(InstanceIds=[instance_id])["Reservations"]
        instances = [i for r in reservations for i in r.get("Instances", [])]
        if not instances:
            raise Ec2TagsError("InvalidInstanceID.NotFound", False, f"AWS has no {what}")
        instance = instances[0]
        current = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
        volumes = [
            m["Ebs"]["VolumeId"]
            for m in instance.get("BlockDeviceMappings", [])
            if "VolumeId" in m.get("Ebs", {})
        ]
        created = {key: value for key, value in desired.items() if current.get(key) != value}
        # only a tag we set, still holding our value (someone who changed it since made it theirs)
        deleted = tuple(
            sorted(
                key for key, value in last_applied.items() if key not in desired and current.get(key) == value
            )
        )
        resources = [instance_id, *volumes]
        if created:
            client.create_tags(Resources=[instance_id], Tags=_pairs(created))
        if volumes and desired:  # the whole set, as the instance carries it (created: only its difference)
            client.create_tags(Resources=volumes, Tags=_pairs(desired))
        if deleted:
            client.delete_tags(
                Resources=resources, Tags=[{"Key": key, "Value": last_applied[key]} for key in deleted]
            )
        return TagsApplied(created, deleted)
    except botocore.exceptions.ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code") or "Unknown")
        retriable = classify(code)
        known = "" if retriable or code in TERMINAL_CODES else " (an error code this service does not know)"
        kind = "retriable" if retriable else "terminal"
        raise Ec2TagsError(code, retriable, f"AWS answered {code} for {what}: {kind}{known}") from None
    except (
        botocore.exceptions.EndpointConnectionError,
        botocore.exceptions.ConnectionClosedError,
        botocore.exceptions.ConnectTimeoutError,
        botocore.exceptions.ReadTimeoutError,
    ):
        raise Ec2TagsError(
            "Unreachable", True, f"the AWS API could not be reached for {what}: retriable"
        ) from None
    except botocore.exceptions.BotoCoreError as exc:  # no region, bad endpoint: nothing a retry changes
        raise Ec2TagsError(
            type(exc).__name__, False, f"the AWS client failed for {what} ({type(exc).__name__}): terminal"
        ) from None


def _pairs(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]
