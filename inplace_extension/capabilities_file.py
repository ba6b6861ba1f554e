"""The ``--capabilities-file`` of user-defined capabilities (docs/capabilities.md): model, loading, errors.

Read once at start-up (``inplace_extension.engine.load_config``: ``serve``, ``mcm-agent``, ``plan``); a
bad file stops the service with a message naming the file, the line and the field. The result is a pure
:class:`inplace_extension.inplace.custom.CustomTable` that the hooks pass to the decision and plan functions.
Its JSON Schema (``schemas/capabilities.schema.json``) is generated from :class:`CapabilitiesFile`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inplace_extension.inplace.capabilities import CAPABILITIES, capability_names
from inplace_extension.inplace.cel import compile_expression
from inplace_extension.inplace.custom import (
    CustomCapability,
    CustomClaim,
    CustomTable,
    Disruption,
    HealthCheck,
    ObjectCheck,
    overlap_problems,
)
from inplace_extension.inplace.shipped import (
    KUBELET_CREDENTIALS,
    OS_UPDATE,
    SHIPPED,
    KubeletCredentialsRule,
    OsUpdateRule,
)
from inplace_extension.runs.role_settings import RoleSettings
from inplace_extension.runs.windows import NO_WINDOWS, MaintenanceWindow, Schedule
from inplace_extension.validation import described
from inplace_extension.yamlfile import locate, parse_model, read_file

# Capability and role names become Ansible variable prefixes (<name>_values) and role names, and the
# runs layer accepts only this shape for capability names (inplace_extension/runs/service.py).
NAME_PATTERN: Final = described(
    r"^[a-z][a-z0-9_]{0,62}$",
    "a name of lowercase letters, digits and _ that starts with a letter (at most 63), e.g. os_image",
)
# RFC 6901: "/" then tokens, "~" only as the escapes ~0 and ~1.
POINTER_PATTERN: Final = described(
    r"^(/([^~/]|~[01])*)+$",
    'a JSON pointer starting with "/" ("~" only as ~0 for "~" and ~1 for "/"), e.g. /image/url',
)
KIND_PATTERN: Final = described(
    r"^[A-Z][A-Za-z0-9]{0,62}$",
    "a kind: a capital letter, then letters and digits (at most 63), e.g. Metal3Machine",
)


class CapabilitiesFileError(ValueError):
    """The capabilities file is missing, not YAML, invalid, or clashes with the built-ins."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClaimEntry(_Strict):
    """One claimed field: the machine-level kind and a pointer relative to its ``/spec``."""

    kind: str = Field(
        pattern=KIND_PATTERN,
        description="machine-level kind (Metal3Machine, KubeadmConfig, Machine); the claim also applies "
        "to its template shape (Metal3MachineTemplate, KubeadmConfigTemplate, MachineSet)",
    )
    pointer: str = Field(
        pattern=POINTER_PATTERN,
        description="JSON pointer relative to the object's spec (template: spec.template.spec): /image/url",
    )

    @field_validator("kind")
    @classmethod
    def _machine_level(cls, value: str) -> str:
        if value.endswith("Template") or value == "MachineSet":
            raise ValueError(
                "name the machine-level kind (e.g. Metal3Machine, Machine); its claims apply to the "
                "template shape (Metal3MachineTemplate, MachineSet) as well"
            )
        return value


class CapabilityEntry(_Strict):
    """One user-defined capability: what it claims and the role that carries it out."""

    name: str = Field(pattern=NAME_PATTERN, description="capability name; the role gets <name>_values")
    role: str = Field(pattern=NAME_PATTERN, description="name of the Ansible role under roles_path")
    roles_path: Path = Field(description="absolute directory that holds the role")
    claims: list[ClaimEntry] = Field(min_length=1, description="claimed fields, in any kind")
    disruption: Literal["none", "restart-kubelet", "reboot"] = Field(
        "reboot",
        description="what the role does to the node: none (workloads untouched), restart-kubelet, reboot; "
        "restart-kubelet and reboot drain the node first and set affectsAvailability; an undeclared "
        "role is taken to reboot",
    )

    @field_validator("roles_path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value


ABSOLUTE_PATTERN: Final = described(
    r"^/[^\x00-\x1f]*$", "an absolute path without control characters, e.g. /usr/local/sbin/os-update"
)
ANNOTATION_PATTERN: Final = described(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    "a Kubernetes annotation or label key, an optional DNS prefix and / then letters, digits, -, _ and "
    ". (starting and ending with a letter or digit), e.g. example.com/rotate-kubelet-credentials",
)


def _regexes(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
    return patterns


class OsUpdateEntry(_Strict):
    """The shipped ``os_update`` capability: which field feeds it and how its command runs."""

    claim: ClaimEntry = Field(
        description="the field whose value is the OS target, e.g. Metal3Machine /image/url"
    )
    command: str = Field(
        pattern=ABSOLUTE_PATTERN, description="absolute path of the update command (no shell)"
    )
    args: list[str] = Field(
        default_factory=list,
        description='arguments, data; an item exactly "{target}" or "{version}" becomes the field value or '
        "the version found in it",
    )
    version_pattern: str | None = Field(
        None, description="regex searched in the value; group 'version' (or the match) is the target version"
    )
    version_command: list[str] = Field(
        min_length=1, description="argv printing the booted OS version; the first item an absolute path"
    )
    retriable_exit_codes: list[int] = Field(default_factory=list)
    retriable_patterns: list[str] = Field(default_factory=list, description="regexes on stdout+stderr")
    terminal_patterns: list[str] = Field(default_factory=list, description="regexes; win over retriable")
    retries: int = Field(2, ge=0, le=20, description="retries of a retriable failure before it is terminal")
    retry_delay_seconds: int = Field(10, ge=0, le=3600)
    reboot_exit_code: int | None = Field(None, ge=1, le=255, description="exit code meaning: done, reboot")
    reboot_marker_file: str | None = Field(
        None, pattern=ABSOLUTE_PATTERN, description="a file the command creates to ask for a reboot"
    )
    reboot_timeout_seconds: int = Field(600, ge=10, le=7200)

    @field_validator("retriable_patterns", "terminal_patterns")
    @classmethod
    def _compile(cls, value: list[str]) -> list[str]:
        return _regexes(value)

    @field_validator("version_pattern")
    @classmethod
    def _compile_one(cls, value: str | None) -> str | None:
        return None if value is None else _regexes([value])[0]

    @field_validator("version_command")
    @classmethod
    def _absolute_program(cls, value: list[str]) -> list[str]:
        if not value[0].startswith("/"):
            raise ValueError("the first item must be an absolute path (no shell, no PATH lookup)")
        return value

    def rule(self) -> OsUpdateRule:
        return OsUpdateRule(
            command=self.command,
            args=tuple(self.args),
            version_pattern=self.version_pattern,
            version_command=tuple(self.version_command),
            retriable_exit_codes=tuple(self.retriable_exit_codes),
            retriable_patterns=tuple(self.retriable_patterns),
            terminal_patterns=tuple(self.terminal_patterns),
            retries=self.retries,
            retry_delay_seconds=self.retry_delay_seconds,
            reboot_exit_code=self.reboot_exit_code,
            reboot_marker_file=self.reboot_marker_file,
            reboot_timeout_seconds=self.reboot_timeout_seconds,
        )


class KubeletCredentialsEntry(_Strict):
    """The shipped ``kubelet_credentials`` capability: the Machine annotation that asks for a rotation."""

    annotation: str = Field(
        pattern=ANNOTATION_PATTERN,
        description="Machine annotation carrying the rotation timestamp (RFC 3339), e.g. "
        "example.com/rotate-kubelet-credentials",
    )
    kubeconfig: str = Field("/etc/kubernetes/kubelet.conf", pattern=ABSOLUTE_PATTERN)
    bootstrap_kubeconfig: str = Field("/etc/kubernetes/bootstrap-kubelet.conf", pattern=ABSOLUTE_PATTERN)
    cert_dir: str = Field("/var/lib/kubelet/pki", pattern=ABSOLUTE_PATTERN)


# DNS-1123 names (namespaces, most objects) and label values as Kubernetes accepts them
OBJECT_NAME_PATTERN: Final = described(
    r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
    "a Kubernetes object name: lowercase letters, digits, - and . (starting and ending with a letter or "
    "digit, at most 253), e.g. rook-ceph",
)
# DNS-1123 labels: namespaces, plural resource names, window names
DNS_LABEL_PATTERN: Final = described(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "a DNS label: lowercase letters, digits and - (starting and ending with a letter or digit, at most "
    "63), e.g. rook-ceph",
)
LABEL_VALUE_PATTERN: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
API_VERSION_PATTERN: Final = described(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?$",
    "an apiVersion, group/version or a version alone for the core group, e.g. ceph.rook.io/v1, apps/v1, v1",
)


class KubernetesCheckEntry(_Strict):
    """A ``kubernetes`` health check: which objects to read, and the CEL expression each must satisfy."""

    api_version: str = Field(
        pattern=API_VERSION_PATTERN,
        description='group/version of the kind ("ceph.rook.io/v1", "apps/v1"; "v1" for the core group)',
    )
    kind: str = Field(pattern=KIND_PATTERN, description="the kind: CephCluster, StatefulSet")
    namespace: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description="the objects' namespace; leave it out for a cluster-scoped kind",
    )
    name: str | None = Field(
        None, pattern=OBJECT_NAME_PATTERN, description="the one object to read. Give name or selector"
    )
    selector: dict[Annotated[str, Field(pattern=LABEL_KEY_PATTERN)], str] | None = Field(
        None,
        min_length=1,
        description="read every object carrying all these labels; each must satisfy the expression, and "
        "none matching does not hold. Give name or selector",
    )
    expression: str = Field(
        min_length=1,
        max_length=4096,
        description='CEL over the object, bound to "object": object.status.health == "HEALTH_OK"; holds '
        "only when it is true (false, an error such as a missing field, or no object: it does not hold)",
    )
    resource: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description="the kind's plural resource name (as in RBAC rules), when it is not the lowercase "
        "kind + s (es after s, x, ch, sh; ies for a y after a consonant)",
    )
    timeout: str | None = Field(
        None,
        description="how long an update not started yet waits for this check before it fails naming it: "
        '"2h", "30m", "90s" (at most 168h); leave it out to wait as long as it takes. After an update the '
        "health gate's --health-gate-timeout-seconds applies instead",
    )

    @field_validator("selector")
    @classmethod
    def _label_values(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, label in (value or {}).items():
            if not re.match(LABEL_VALUE_PATTERN, label):
                raise ValueError(f"{key}: not a label value (at most 63 letters, digits, -, _, .)")
        return value

    @field_validator("expression")
    @classmethod
    def _compiles(cls, value: str) -> str:
        compile_expression(value)  # ExpressionError is a ValueError: the loader names line and field
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str | None) -> str | None:
        if value is not None:
            duration_seconds(value, with_seconds=True)
        return value

    @model_validator(mode="after")
    def _name_or_selector(self) -> KubernetesCheckEntry:
        if (self.name is None) == (self.selector is None):
            raise ValueError("give exactly one of name (one object) or selector (every object with labels)")
        return self

    def check(self) -> ObjectCheck:
        return ObjectCheck(
            api_version=self.api_version,
            kind=self.kind,
            namespace=self.namespace,
            name=self.name,
            selector=tuple(sorted((self.selector or {}).items())),
            expression=compile_expression(self.expression),
            resource=self.resource,
            start_timeout_seconds=(
                None if self.timeout is None else duration_seconds(self.timeout, with_seconds=True)
            ),
        )


HTTP_URL_PATTERN: Final = described(
    r"^https?://\S+$", "an http:// or https:// URL without blanks, e.g. http://{address}:9100/healthz"
)
NO_NUL_PATTERN: Final = described(r"^[^\x00]*$", "text without NUL characters")


class HealthCheckEntry(_Strict):
    """One user-defined check of the health gate: an HTTP GET (``url``), a command on the host, or a CEL
    expression over cluster objects (``kubernetes``)."""

    name: str = Field(pattern=NAME_PATTERN, description="check name, shown in the health gate's messages")
    url: str | None = Field(
        None,
        pattern=HTTP_URL_PATTERN,
        description="GET this URL after the update (Kubernetes-aware mode only); {address} is the "
        "Machine's host address. Give url or command, not both",
    )
    command: list[Annotated[str, Field(pattern=NO_NUL_PATTERN)]] | None = Field(
        None,
        min_length=1,
        description="argv run as root on the host by the play, after the last role and before the stamp, "
        "in every mode (plain and Kubernetes-aware): no shell, never templated, output discarded; passes "
        "on exit status 0, tried again every second until --health-gate-timeout-seconds. Give url or "
        "command, not both",
    )
    kubernetes: KubernetesCheckEntry | None = Field(
        None,
        description="a CEL expression that must hold of cluster objects before each update starts and "
        "after it ends (Kubernetes-aware mode of serve, and mcm-agent). Give url, command or kubernetes",
    )
    status: int = Field(200, ge=100, le=599, description="the HTTP status the check expects (url only)")
    timeout_seconds: float = Field(
        5.0,
        gt=0,
        le=60,
        description="per request, or per try of a command (a kubernetes check reads with the API "
        "client's own timeouts)",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> HealthCheckEntry:
        given = [self.url is not None, self.command is not None, self.kubernetes is not None]
        if given.count(True) != 1:
            raise ValueError(
                "give exactly one of url (an HTTP check), command (an argv run on the host) or kubernetes "
                "(a CEL expression over cluster objects)"
            )
        if self.command is not None and not self.command[0]:
            raise ValueError("command: the first item (the program) must not be empty")
        if self.url is None and "status" in self.model_fields_set:
            raise ValueError("status is for url checks only (a command check passes on exit status 0)")
        return self

    def check(self) -> HealthCheck:
        if self.command is not None:
            return HealthCheck(self.name, timeout_seconds=self.timeout_seconds, command=tuple(self.command))
        if self.kubernetes is not None:
            return HealthCheck(
                self.name, timeout_seconds=self.timeout_seconds, kubernetes=self.kubernetes.check()
            )
        return HealthCheck(self.name, self.url or "", self.status, self.timeout_seconds)


LABEL_KEY_PATTERN: Final = ANNOTATION_PATTERN  # a Kubernetes label key has the annotation key's shape
DURATION_RE: Final = re.compile(r"^(?:(\d{1,3})h)?(?:(\d{1,5})m)?(?:(\d{1,6})s)?$")
MAX_DURATION_SECONDS: Final = 7 * 24 * 3600


def duration_seconds(value: str, with_seconds: bool = False) -> int:
    """``"4h"``, ``"90m"``, ``"1h30m"`` as seconds (``with_seconds``: also ``"45s"``, ``"2m30s"``: a
    timeout may be short, a maintenance window opens by the minute); ValueError for anything else or
    out of range."""
    match = DURATION_RE.match(value)
    if not value or match is None or (match.group(3) is not None and not with_seconds):
        units = 'hours, minutes and/or seconds: "2h", "90m", "1h30m", "45s"'
        raise ValueError(
            f"give {units}" if with_seconds else 'give hours and/or minutes: "4h", "90m", "1h30m"'
        )
    seconds = int(match.group(1) or 0) * 3600 + int(match.group(2) or 0) * 60 + int(match.group(3) or 0)
    if not 0 < seconds <= MAX_DURATION_SECONDS:
        raise ValueError("must be longer than 0 and at most 7 days (168h)")
    return seconds


class MaintenanceWindowEntry(_Strict):
    """One maintenance window: new updates start only while it is open (docs/operations.md)."""

    name: str = Field(pattern=DNS_LABEL_PATTERN, description="shown in the messages")
    cron: str = Field(
        description='when the window opens: a 5-field cron expression ("0 22 * * 1-5": weeknights at 22:00)'
    )
    duration: str = Field(description='how long it stays open: hours and/or minutes, "4h", "90m", "1h30m"')
    time_zone: str = Field("UTC", description='IANA time zone of the cron expression ("Europe/Berlin")')
    labels: dict[Annotated[str, Field(pattern=LABEL_KEY_PATTERN)], str] = Field(
        default_factory=dict,
        description="the window applies only to Machines (MCM: Nodes) carrying all these labels, e.g. "
        "cluster.x-k8s.io/cluster-name or cluster.x-k8s.io/deployment-name; none: to all",
    )

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError("not a 5-field cron expression (minute hour day-of-month month day-of-week)")
        return value

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_seconds(value)
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("not a known IANA time zone (e.g. UTC, Europe/Berlin)") from None
        return value

    def window(self) -> MaintenanceWindow:
        labels = tuple(sorted(self.labels.items()))
        return MaintenanceWindow(
            self.name, self.cron, duration_seconds(self.duration), self.time_zone, labels
        )


class CapabilitiesFile(_Strict):
    """The ``--capabilities-file``: capabilities run after the built-ins, in this order, and the operator's
    controls (maintenance windows)."""

    os_update: OsUpdateEntry | None = Field(None, description="shipped os_update capability (runs first)")
    kubelet_credentials: KubeletCredentialsEntry | None = Field(
        None, description="shipped kubelet_credentials capability (runs after os_update)"
    )
    capabilities: list[CapabilityEntry] = Field(default_factory=list)
    health_checks: list[HealthCheckEntry] = Field(
        default_factory=list,
        description="the health gate's checks: HTTP (Kubernetes-aware), host commands, or CEL over cluster "
        "objects (kubernetes)",
    )
    maintenance_windows: list[MaintenanceWindowEntry] = Field(
        default_factory=list, description="new updates start only while one of a Machine's windows is open"
    )
    role_settings: RoleSettings = Field(
        default_factory=RoleSettings,
        description="the shipped roles' settings to change from their defaults (an internal mirror, "
        "another package source, longer health waits), handed to every play as extra vars",
    )

    @field_validator("maintenance_windows")
    @classmethod
    def _unique_names(cls, value: list[MaintenanceWindowEntry]) -> list[MaintenanceWindowEntry]:
        names = [entry.name for entry in value]
        if len(set(names)) != len(names):
            raise ValueError("window names must be unique (messages name the window)")
        return value


@dataclass(frozen=True)
class FileConfig:
    """Everything the capabilities file configures: the capabilities table, the maintenance windows and
    the roles' settings (as the Ansible variables they set)."""

    custom: CustomTable
    windows: Schedule = NO_WINDOWS
    role_vars: Mapping[str, Any] = field(default_factory=dict)


def _shipped(model: CapabilitiesFile) -> tuple[CustomCapability, ...]:
    """The shipped capabilities the file configures; roles_path "" = the playbook's own roles/."""
    shipped = []
    if model.os_update is not None:
        claim = CustomClaim(model.os_update.claim.kind, model.os_update.claim.pointer)
        shipped.append(
            CustomCapability(OS_UPDATE, OS_UPDATE, "", (claim,), Disruption.REBOOT, model.os_update.rule())
        )
    if model.kubelet_credentials is not None:
        entry = model.kubelet_credentials
        claim = CustomClaim("Machine", "", annotation=entry.annotation)
        rule = KubeletCredentialsRule(entry.kubeconfig, entry.bootstrap_kubeconfig, entry.cert_dir)
        shipped.append(
            CustomCapability(
                KUBELET_CREDENTIALS, KUBELET_CREDENTIALS, "", (claim,), Disruption.RESTART_KUBELET, rule
            )
        )
    return tuple(shipped)


def _builtin_claims(shipped: tuple[CustomCapability, ...]) -> dict[str, list[str]]:
    claims: dict[str, list[str]] = {}
    for capability in CAPABILITIES:
        for claim in capability.claims:
            claims.setdefault(claim.kind.value, []).append(claim.pointer)
    for extra in shipped:
        for custom_claim in extra.claims:
            if custom_claim.annotation is None:
                claims.setdefault(custom_claim.kind, []).append(custom_claim.pointer)
    return claims


def load_capabilities(path: Path) -> CustomTable:
    """Read, validate and check a capabilities file; errors name the file, the line and the field."""
    return load_file(path).custom


def load_file(path: Path) -> FileConfig:
    """All of a capabilities file (capabilities, windows); errors name the file, the line and the field."""
    text = read_file(path, f"capabilities file {path}", CapabilitiesFileError)
    return parse_file(text, str(path))


def parse_capabilities(text: str, source: str = "<capabilities>") -> CustomTable:
    return parse_file(text, source).custom


def parse_file(text: str, source: str = "<capabilities>") -> FileConfig:
    model, node = parse_model(text, CapabilitiesFile, f"capabilities file {source}", CapabilitiesFileError)
    shipped = _shipped(model)
    table = CustomTable(
        shipped
        + tuple(
            CustomCapability(
                name=entry.name,
                role=entry.role,
                roles_path=str(entry.roles_path),
                claims=tuple(CustomClaim(claim.kind, claim.pointer) for claim in entry.claims),
                disruption=Disruption.parse(entry.disruption),
            )
            for entry in model.capabilities
        ),
        tuple(entry.check() for entry in model.health_checks),
    )
    user = table.capabilities[len(shipped) :]
    problems = [
        locate(node, loc, message)
        for loc, message in overlap_problems(user, _builtin_claims(shipped), (*capability_names(), *SHIPPED))
    ]
    for index, entry in enumerate(model.capabilities):
        # checked here, not at the first UpdateMachine: a missing role would fail every run much later
        tasks = entry.roles_path / entry.role / "tasks"
        if not (tasks / "main.yml").is_file() and not (tasks / "main.yaml").is_file():
            problems.append(locate(node, ("capabilities", index, "role"), f"no role at {tasks.parent}"))
    if problems:
        raise CapabilitiesFileError(f"capabilities file {source}: " + "; ".join(problems))
    windows = Schedule(tuple(entry.window() for entry in model.maintenance_windows))
    return FileConfig(table, windows, model.role_settings.extra_vars())
