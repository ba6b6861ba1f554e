"""The host dry run through the ``kubernetes`` executor, lab-free (kubejobs/dry_run.py): the check Job's
shape (the attempt Job's, running ``check-host``, labelled dry-run, no API access, no lock token), the
check through the termination message (round trip; diffs too large for it said so, never cut silently),
and the caller's side over the in-memory cluster (tests/kubefake.py): one Job per host, each deleted once
read, a Job that ends without a check or cannot start an error of its Machine only. The real Jobs on the
lab's real nodes: tests/nodes/test_node_dry_run.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kubefake import FakeJobs

from inplace_extension.kubejobs import dry_run
from inplace_extension.kubejobs.dry_run import (
    DryRunJobs,
    check_hosts_in_jobs,
    decode_check,
    dry_run_manifests,
    encode_check,
)
from inplace_extension.kubejobs.manifest import ATTEMPT_KEY_FILE, JobConfig
from inplace_extension.kubejobs.spec import TERMINATION_MESSAGE_LIMIT, AttemptSpec
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.plays.dry_run import ERROR, UNCHANGED, WOULD_CHANGE, DryRun, HostCheck, StepCheck
from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import HostTarget

CONFIG = JobConfig(
    namespace="jobs",
    image="example.org/inplace:1",
    service_account="sa",
    deadline_seconds=600,
    ttl_seconds=60,
)
PLAY = PlayConfig(roles_paths=(), host_checks=(), role_vars={"ntp_pool": "x"})


def a_run(name: str, key: Path | None = None) -> DryRun:
    request = RunRequest(
        namespace="default",
        name=name,
        fingerprint="f" * 64,
        capabilities=("kubeadm_files",),
        inputs={"kubeadm_files": {"files": []}},
    )
    target = HostTarget(
        address="10.0.0.7",
        port=22,
        user="root",
        private_key_file=key,
        become=False,
        host_keys=("ssh-ed25519 AAAA",),
        insecure_skip_host_key_check=False,
        python_interpreter=None,
        source="inventory",
    )
    return DryRun(request, target)


def a_check(machine: str, diff: str = "--- a\n+++ b\n-x\n+y\n") -> HostCheck:
    steps = (
        StepCheck("kubeadm_files", WOULD_CHANGE, "1 task(s) would change the host", (diff,), ("a -> b",)),
        StepCheck("ntp", UNCHANGED, "the host's stamp holds this step with these inputs"),
    )
    return HostCheck(machine, "10.0.0.7", WOULD_CHANGE, None, steps)


def test_the_check_job_is_the_attempt_jobs_shape_running_check_host_without_api_access(
    tmp_path: Path,
) -> None:
    job, secret = dry_run_manifests(
        CONFIG, a_run("md-0-a"), {"playbooks_dir": "/p", "kube": True}, PLAY, b"KEY"
    )
    name = job["metadata"]["name"]
    assert name.startswith("inplace-dry-run-") and len(name) <= 63
    assert secret["metadata"]["name"] == name
    labels = job["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "dry-run", labels
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == dry_run.DRY_RUN_TTL_SECONDS
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "sa" and pod["automountServiceAccountToken"] is False
    assert "kube-api-access" not in json.dumps(pod), pod  # no token: the check calls no API
    assert [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v] == [name]
    [container] = pod["containers"]
    assert container["image"] == CONFIG.image
    assert container["args"] == ["check-host", "--spec", "/etc/inplace-extension/attempt/attempt.json"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not [e for e in container["env"] if e["name"].startswith("POD_")]
    # the spec: no lock token, no retry token; the host's key the Secret's copy; the check reaches no cluster
    spec = AttemptSpec.decode(secret["stringData"]["attempt.json"])
    assert (spec.lock_token, spec.token, spec.takeover_tokens, spec.host_checks) == ("", "", (), ())
    assert spec.target.private_key_file == Path(ATTEMPT_KEY_FILE)
    assert spec.settings["kube"] is False and spec.role_vars == {"ntp_pool": "x"}
    assert base64.b64decode(secret["data"]["ssh-key"]) == b"KEY"
    # a second dry run of the same Machine never meets the first
    again, _ = dry_run_manifests(CONFIG, a_run("md-0-a"), {}, PLAY, None)
    assert again["metadata"]["name"] != name


def test_a_check_comes_back_through_the_termination_message_as_it_was() -> None:
    check = a_check("default/md-0-a")
    message = encode_check(check)
    assert len(message.encode()) <= TERMINATION_MESSAGE_LIMIT
    assert decode_check(message) == check


def test_diffs_too_large_for_the_termination_message_are_left_out_and_said_so() -> None:
    # random-looking lines: they do not compress below the limit
    big = "".join(
        f"+{base64.b64encode(bytes([i % 251, i % 7, i % 13]) * 8).decode()}{i}\n" for i in range(800)
    )
    check = a_check("default/md-0-a", diff=big)
    message = encode_check(check)
    assert len(message.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = decode_check(message)
    step = back.steps[0]
    assert (back.result, step.result, step.changes) == (WOULD_CHANGE, WOULD_CHANGE, ("a -> b",))
    [note] = step.diffs
    assert f"diff of {len(big.encode())} bytes left out" in note and "--executor local" in note, note
    assert back.steps[1] == check.steps[1]


def test_a_message_that_is_not_a_check_is_refused() -> None:
    with pytest.raises(ValueError, match="not a host check"):
        decode_check('{"kind":"successful"}')


class Cluster(FakeJobs):
    """The in-memory cluster, whose Jobs end as the test says once created (the job controller's and the
    Pod's part): ``answers`` maps a Machine's name to its Job's termination message, or to a Pod status
    that never starts."""

    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__()
        self.answers = answers
        self.created: list[dict[str, Any]] = []

    def create_job(self, job: Any, secret: Any) -> bool:
        created = super().create_job(job, secret)
        self.created.append(job)
        machine = job["metadata"]["labels"]["inplace-extension.io/machine"]
        answer = self.answers[machine]
        fake = self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])]
        if isinstance(answer, dict):
            fake.pod_status = answer
        else:
            fake.finished, fake.termination_message = True, answer
        return created


def test_each_host_is_checked_in_a_job_of_its_own_and_every_job_is_deleted(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_bytes(b"PRIVATE")
    unschedulable = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
        ],
    }
    cluster = Cluster(
        {
            "md-0-a": encode_check(a_check("default/md-0-a")),
            "md-0-b": None,  # its Pod killed before it wrote a check
            "md-0-c": unschedulable,
            "md-0-d": encode_check(a_check("default/someone-else")),  # a check of another name
        }
    )
    now = [0.0]
    where = DryRunJobs(
        jobs=cluster,
        config=CONFIG,
        settings={},
        play=PLAY,
        start_seconds=5,
        clock=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
    )
    seen: list[str] = []
    runs = [a_run("md-0-a", key), a_run("md-0-b", key), a_run("md-0-c", key), a_run("md-0-d", key)]

    checks = check_hosts_in_jobs(runs, where, max_parallel=2, on_host=lambda c: seen.append(c.machine))

    assert [c.machine for c in checks] == [f"default/md-0-{x}" for x in "abcd"]
    assert checks[0] == a_check("default/md-0-a")
    assert checks[1].result == ERROR and "ended without a result" in str(checks[1].error), checks[1]
    assert checks[2].result == ERROR and "did not start: Pod cannot be scheduled" in str(checks[2].error)
    assert sorted(seen) == sorted(c.machine for c in checks)
    assert checks[3].result == WOULD_CHANGE  # this Machine's answer, under its own name
    assert len(cluster.created) == 4
    assert not cluster.jobs and not cluster.secrets  # each Job and its Secret deleted once read
    assert sorted(cluster.deleted) == sorted(job["metadata"]["name"] for job in cluster.created)


def test_an_unreadable_private_key_is_that_machines_error(tmp_path: Path) -> None:
    cluster = Cluster({"md-0-a": encode_check(a_check("default/md-0-a"))})
    where = DryRunJobs(jobs=cluster, config=CONFIG, settings={}, play=PLAY, start_seconds=5)
    [check] = check_hosts_in_jobs([a_run("md-0-b", tmp_path / "missing")], where, max_parallel=1)
    assert check.result == ERROR and "private key cannot be read" in str(check.error), check
    assert not cluster.created
