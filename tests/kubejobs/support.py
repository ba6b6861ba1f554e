"""The ``kubernetes`` executor for the lab-free tests: one :class:`JobConfig`, its
:class:`~inplace_extension.kubejobs.backend.JobBackend` over the ports a test hands it (tests/kubefake.py's
Jobs, a record store on Machines or on Nodes) and a Job's termination message as the attempt writes it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubefake import FakeJobs
from runs.test_service import INVENTORY

from inplace_extension.kube.port import JobCluster, RecordRef, RecordStore
from inplace_extension.kubejobs.backend import JobBackend
from inplace_extension.kubejobs.manifest import JobConfig
from inplace_extension.kubejobs.spec import termination_message
from inplace_extension.plays.batch import NO_PLAY_CONFIG
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import NO_CLUSTER_SIDE, ClusterSide, RunRequest
from inplace_extension.settings import Settings

CONFIG = JobConfig(
    namespace="inplace-extension-system",
    image="inplace-extension:0.1.0",
    service_account="inplace-extension-attempt",
    deadline_seconds=1800,
    ttl_seconds=3600,
)

START_SECONDS = 600.0  # --job-start-timeout-seconds' default
MACHINE = RecordRef("Machine", "m1", "default")  # the Machine of the tests' requests
PRIVATE_KEY = (  # the inventory's key file: the service copies it into each attempt's own Secret
    b"-----BEGIN OPENSSH PRIVATE KEY-----\nthe target's own key\n-----END OPENSSH PRIVATE KEY-----\n"
)


def kube_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """The service's settings for the ``kubernetes`` executor: the tests' inventory with a real key
    file (:data:`PRIVATE_KEY`), its host's range allowed, a runs dir under ``tmp_path``."""
    key = tmp_path / "ssh" / "id"
    key.parent.mkdir()
    key.write_bytes(PRIVATE_KEY)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY.replace("/keys/id", str(key)))
    fields: dict[str, Any] = {
        "inventory": inventory,
        "allowed_cidrs": ["10.79.9.0/24"],
        "runs_dir": tmp_path / "runs",
        "retry_after_seconds": 1,
        "executor": "kubernetes",
    }
    return Settings(**{**fields, **overrides})


def machine_cluster() -> FakeJobs:
    """An in-memory cluster holding :data:`MACHINE`, its Node ``node-1``."""
    fake = FakeJobs()
    fake.add(MACHINE, node="node-1")
    return fake


def machine_of(request: RunRequest) -> RecordRef:
    """Where the record of ``request`` lives: its Machine."""
    return RecordRef("Machine", request.name, request.namespace)


def job_backend(
    jobs: JobCluster,
    records: RecordStore,
    where: Callable[[RunRequest], RecordRef],
    clock: Callable[[], float],
    cluster: ClusterSide = NO_CLUSTER_SIDE,
    start_seconds: float = START_SECONDS,
    job_settings: Mapping[str, Any] | None = None,
) -> JobBackend:
    """A replica's backend: :data:`CONFIG`, the Jobs' settings ``job_settings`` (none by default), no
    capabilities file; the record of each request on the object ``where`` names; a Job that did not
    start posted to ``cluster``."""
    return JobBackend(
        jobs=jobs,
        records=records,
        where=where,
        config=CONFIG,
        play=NO_PLAY_CONFIG,
        job_settings=job_settings or {},
        capabilities_file=None,
        clock=clock,
        cluster=cluster,
        start_seconds=start_seconds,
    )


def outcome(
    kind: OutcomeKind, finished: float, capability: str | None = None, task: str | None = None
) -> str:
    """The termination message of a Job whose attempt ended ``kind`` at ``finished``."""
    return termination_message(Outcome(kind, capability=capability, task=task, finished=finished))
