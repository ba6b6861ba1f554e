"""Service settings: one pydantic-settings model, given by CLI flags and ``INPLACE_*`` environment variables.

Every other module receives a :class:`Settings` instance; nothing reads the environment by itself, not
even this model: the CLI (``inplace_extension.cli.flags``) hands it exactly the settings of the command
that runs, from its flags and its variables, so that a variable of a setting the command does not use is
never taken in silence (it is warned about), and a misspelt one is refused.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from inplace_extension.validation import described

# CAPI's own SDK server caps request bodies at 20 MiB (docs/capi-hooks.md §9.1)
MAX_BODY_BYTES = 20 * 1024 * 1024


def default_state_dir() -> Path:
    """Where the service keeps its state by default (run artifacts, the dev TLS): $XDG_STATE_HOME's
    ``inplace-extension``, ``~/.local/state/inplace-extension`` when it is unset."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "inplace-extension"


class Settings(BaseSettings):
    """All knobs of the service. Flag ``--foo-bar`` = field ``foo_bar`` = env ``INPLACE_FOO_BAR``."""

    model_config = SettingsConfigDict(env_prefix="INPLACE_", extra="forbid")

    # edge
    listen: str = Field("0.0.0.0:9443", description="HOST:PORT to listen on")
    path_prefix: str = Field(
        "",
        pattern=described("^(/.*)?$", "a URL path that starts with /, e.g. /inplace"),
        description="optional URL path prefix before /hooks.runtime.cluster.x-k8s.io",
    )
    tls_cert: Path | None = Field(None, description="PEM certificate (chain) to serve")
    tls_key: Path | None = Field(None, description="PEM private key of --tls-cert")
    self_signed: bool = Field(False, description="generate a self-signed development certificate")
    plain_http: bool = Field(False, description="serve plain HTTP (local testing only)")
    client_ca: Path | None = Field(None, description="require client certificates signed by this CA (mTLS)")
    bearer_token_file: Path | None = Field(
        None, description="also accept callers presenting this bearer token"
    )
    max_body_bytes: int = Field(MAX_BODY_BYTES, description="request body cap; larger bodies get HTTP 413")
    log_format: str = Field(
        "text", pattern=described("^(text|json)$", "text or json"), description="log line format"
    )
    access_log: bool = Field(False, description="also log one line per HTTP request (uvicorn's access log)")
    log_level: str = Field(
        "INFO",
        pattern=described(
            "^(?i:debug|info|warning|error|critical)$", "one of debug, info, warning, error, critical"
        ),
        description="log level",
    )
    tls_dir: Path = Field(
        default_factory=lambda: default_state_dir() / "tls",
        description="where --self-signed keeps its generated CA (ca.crt), certificate and key",
    )
    tls_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="extra DNS names/IPs for the --self-signed certificate (comma-separated)",
    )

    # runs
    inventory: Path | None = Field(None, description="inventory YAML mapping Machines to SSH targets")
    allowed_cidrs: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="host addresses that may be contacted"
    )
    runs_dir: Path = Field(default_factory=lambda: default_state_dir() / "runs", description="run artifacts")
    max_parallel_runs: int = Field(8, ge=1, le=256, description="runs at once; the rest wait in a FIFO queue")
    retry_after_seconds: int = Field(10, ge=1, le=3600, description="retryAfterSeconds while a run goes on")
    max_failed_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="retry budget: after this many failed attempts (host unreachable, run interrupted) of "
        "the same desired state the update is blocked until the retry annotation changes",
    )
    playbooks_dir: Path | None = Field(None, description="playbooks directory (default: the packaged one)")
    fork_server: bool = Field(
        True,
        description="local executor: start each play from a warm ansible-playbook (a fork server that has "
        "imported ansible-core once) instead of a new process; off: a new ansible-playbook per play",
    )
    capabilities_file: Path | None = Field(None, description="user-defined capabilities YAML")
    affects_availability: bool = Field(
        True,
        description="send affectsAvailability in CanUpdate* answers that claim changes (CAPI v1.15; "
        "v1.14 ignores unknown response fields)",
    )

    executor: Literal["local", "kubernetes"] = Field(
        "local",
        description="where each update attempt runs: local (a play in this process, the record in "
        "--runs-dir) or kubernetes (one Job per attempt, the record on the Machine or Node; needs cluster "
        "access)",
    )
    job_image: str | None = Field(
        None, description="kubernetes executor: the image of each attempt's Job (default: --pod-name's)"
    )
    pod_name: str | None = Field(
        None,
        description="kubernetes executor: this service's Pod (set from the downward API), in "
        "--job-namespace: the Jobs run its image unless --job-image names one",
    )
    job_namespace: str = Field(
        "inplace-extension-system", description="kubernetes executor: the namespace of the Jobs"
    )
    job_service_account: str = Field(
        "inplace-extension-attempt", description="kubernetes executor: the Jobs' ServiceAccount"
    )
    job_playbooks_dir: str | None = Field(
        None,
        # the default is right when the Jobs run the service's own image; a service outside that image,
        # or a --job-image that keeps them elsewhere, names it
        description="kubernetes executor: the playbooks directory in the Jobs' image "
        "(default: --playbooks-dir)",
    )
    job_deadline_seconds: int = Field(
        3600,
        ge=60,
        le=86400,
        description="kubernetes executor: a Job's activeDeadlineSeconds (the play timeout)",
    )
    job_ttl_seconds: int = Field(
        3600,
        ge=60,
        le=7 * 86400,
        description="kubernetes executor: a finished Job (and its logs) is kept this long once its outcome "
        "is in the record (until then up to 7 days)",
    )
    job_start_timeout_seconds: int = Field(
        600,
        ge=60,
        le=86400,
        # a Pod that cannot start (unschedulable, its image not pulled, a Secret missing) is named at
        # once; past this it is given up: deleted, and the attempt retried within the retry budget
        description="kubernetes executor: a Job whose Pod cannot start is deleted and its attempt "
        "retried this long after the attempt began",
    )

    # Kubernetes-aware mode (docs/kube-aware.md): on with --kube or --kubeconfig
    kube: bool = Field(
        False,
        description="read Machines, drain Nodes, post Events (with $KUBECONFIG, else the in-cluster account)",
    )
    kubeconfig: Path | None = Field(None, description="management cluster kubeconfig (implies --kube)")
    workload_kubeconfig: str = Field(
        "secret",
        description="where a cluster's workload kubeconfig comes from: secret (CAPI's <cluster>-kubeconfig "
        "Secret), management (the Nodes are in the management cluster) or an absolute kubeconfig path",
    )
    address_types: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["InternalIP", "ExternalIP"],
        description="status.addresses types (the Machine's; for mcm-agent the Node's) to take the host "
        "address from, in this order",
    )
    drain: Literal["auto", "always", "never"] = Field(
        "auto",
        description="auto: right before the first restart-kubelet-or-above step; "
        "always: before the first step; never",
    )
    drain_timeout_seconds: int = Field(300, ge=1, le=86400, description="give up draining after this long")
    drain_grace_seconds: int | None = Field(
        None, ge=0, description="grace period of each eviction (default: the Pod's own)"
    )
    drain_delete_emptydir_data: bool = Field(False, description="also evict Pods with emptyDir volumes")
    drain_wait_for_blocking_pdbs: bool = Field(
        False,
        description="wait until the drain timeout on a PodDisruptionBudget that can never allow an eviction "
        "(maxUnavailable 0, or all its Pods healthy and none allowed to go) instead of failing at once",
    )
    health_gate_timeout_seconds: int = Field(
        300,
        ge=1,
        le=86400,
        description="after the play: Node Ready at the target version within this long; in every mode, "
        "how long the capabilities file's command checks may take to pass on the host",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # only the values given: the CLI reads each command's own variables (cli/flags.py), so that a
        # variable of a setting the command does not use cannot slip in here
        return (init_settings,)

    @property
    def kube_aware(self) -> bool:
        return self.kube or self.kubeconfig is not None

    @field_validator("allowed_cidrs", "tls_hosts", "address_types", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        # env vars and flags give "10.0.0.0/8,192.168.1.0/24" (or a JSON list); a list is taken as is
        if isinstance(value, str):
            if value.strip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("allowed_cidrs")
    @classmethod
    def _check_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value
