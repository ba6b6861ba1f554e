"""UpdateMachine end to end on lab hosts: the real service, driven over HTTP the way CAPI drives it.

Each test: CanUpdateMachineSet for a MachineDeployment change, then UpdateMachine polled per Machine
honouring retryAfterSeconds, then the hosts are inspected over SSH/nsenter. See conftest.py for what
is a stand-in.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostlab import faults
from hostlab.lab import Host, Lab
from hostlab.pytest_plugin import WriteInventory

from inplace_extension.runs import progress

from .capi import BOOTSTRAP_TOKEN, NodeSpec, Polled, can_update_machine_set, poll_update_machine
from .conftest import NEXT_VERSION, START_VERSION, StartService
from .hostcheck import STATE_DIR, lock_events, lock_log, overlapping_holders, run_on, stamp_writes

pytestmark = pytest.mark.lab

MACHINES = ["md-0-aaaaa", "md-0-bbbbb", "md-0-ccccc"]
# Shell payloads only: a "{{ ... }}" in KubeadmConfig data is a cloud-init template, rendered only at
# bootstrap, so a changed file holding one is declined (tests/hooks/test_templates.py) and never reaches
# Ansible; Jinja payloads through the service are covered by test_custom_capability.py (Metal3Machine).
PAYLOAD = "hello `touch /tmp/e2e-pwned` $(touch /tmp/e2e-pwned2)\n"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV4YW1wbGUta2V5LWZvci1lMmUtdGVzdHMtb25seQ e2e@test"
RETRY = "inplace-extension.io/retry"
CAPABILITIES = ("users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version")
MESSAGE_RE = progress.pattern(CAPABILITIES)  # every message a poll may answer, from the service's table


def kubelet_args(*pairs: tuple[str, str]) -> dict[str, object]:
    return {"nodeRegistration": {"kubeletExtraArgs": [{"name": k, "value": v} for k, v in pairs]}}


OLD = NodeSpec(START_VERSION, {"joinConfiguration": kubelet_args(("max-pods", "110"))})
FULL = NodeSpec(
    NEXT_VERSION,
    {
        "files": [
            {"path": "/etc/e2e/hello.conf", "content": PAYLOAD, "owner": "root:root", "permissions": "0640"}
        ],
        "users": [{"name": "e2euser", "shell": "/bin/bash", "sshAuthorizedKeys": [KEY]}],
        "ntp": {"enabled": True, "servers": ["ntp1.example.org", "ntp2.example.org"]},
        "joinConfiguration": kubelet_args(("max-pods", "120"), ("node-labels", "e2e=yes")),
    },
)
FILES_AND_ARGS = NodeSpec(
    START_VERSION,
    {
        "files": [
            {"path": "/etc/e2e/small.conf", "content": "small\n", "owner": "root:root", "permissions": "0644"}
        ],
        "joinConfiguration": kubelet_args(("max-pods", "130")),
    },
)


def poll_all(client: httpx.Client, spec: NodeSpec, names: list[str], **kw: Any) -> dict[str, Polled]:
    with ThreadPoolExecutor(len(names)) as pool:
        futures = {n: pool.submit(poll_update_machine, client, n, spec, **kw) for n in names}
        return {n: f.result() for n, f in futures.items()}


def attempts(runs_dir: Path, name: str) -> list[Path]:
    return sorted(runs_dir.glob(f"e2e.{name}.*/attempt-*"))


def test_rollout_updates_every_capability_on_three_hosts(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService
) -> None:
    service = start_service(lab_inventory(MACHINES))
    can_update_machine_set(service.client, OLD, FULL)
    results = poll_all(service.client, FULL, MACHINES)
    for name, host in zip(MACHINES, nodes, strict=True):
        polled = results[name]
        assert (polled.status, polled.message) == ("Success", "update applied"), polled.messages
        assert polled.calls > 1  # the run took time: CAPI was told to come back
        assert all(MESSAGE_RE.fullmatch(m) for m in polled.messages), polled.messages
        assert any(m.startswith("running: ") for m in polled.messages)
        # the host: literal payload (never templated, never run by a shell), owner and mode
        assert run_on(lab, host, ["cat", "/etc/e2e/hello.conf"]) == PAYLOAD
        assert run_on(lab, host, ["stat", "-c", "%U:%G %a", "/etc/e2e/hello.conf"]).strip() == "root:root 640"
        assert run_on(lab, host, ["sh", "-c", "ls /tmp/e2e-pwned* 2>/dev/null || true"]) == ""
        kubelet_env = run_on(lab, host, ["cat", "/etc/default/kubelet"])
        assert "--max-pods=120" in kubelet_env and "--node-labels=e2e=yes" in kubelet_env
        assert run_on(lab, host, ["getent", "passwd", "e2euser"]).startswith("e2euser:")
        assert KEY in run_on(lab, host, ["cat", "/home/e2euser/.ssh/authorized_keys"])
        ntp_conf = run_on(lab, host, ["sh", "-c", "cat /etc/systemd/timesyncd.conf.d/*.conf"])
        assert "ntp1.example.org" in ntp_conf and "ntp2.example.org" in ntp_conf
        assert NEXT_VERSION in run_on(lab, host, ["kubelet", "--version"])
        assert len(stamp_writes(lab, host)) == 1
    assert not Path("/tmp/e2e-pwned").exists() and not Path("/tmp/e2e-pwned2").exists()
    # CAPI may call again after completion: done at once, nothing re-applied
    again = poll_all(service.client, FULL, MACHINES)
    assert all((p.status, p.calls) == ("Success", 1) for p in again.values())
    assert all(len(stamp_writes(lab, h)) == 1 for h in nodes)
    log = service.log()
    for name in MACHINES:
        assert re.search(rf"machine=e2e/{name} run=e2e\.{name}\.[0-9a-f]{{12}} state=successful", log)
    assert BOOTSTRAP_TOKEN not in log
    # /metrics of the real service after the real runs: every host's run counted, nothing left in flight
    scrape = service.client.get("/metrics").text
    runs_ok = re.search(r'^inplace_extension_runs_total\{outcome="successful"\} (\S+)$', scrape, re.M)
    assert runs_ok is not None and float(runs_ok.group(1)) == len(MACHINES)
    assert re.search(r"^inplace_extension_run_duration_seconds_count (\S+)$", scrape, re.M)
    assert re.search(r"^inplace_extension_runs_in_flight 0\.0$", scrape, re.M)
    assert re.search(r"^inplace_extension_run_queue_length 0\.0$", scrape, re.M)
    updates = r'^inplace_extension_hook_calls_total\{hook="UpdateMachine",status="Success"\} (\S+)$'
    update_calls = re.search(updates, scrape, re.M)
    assert update_calls is not None and float(update_calls.group(1)) >= 2 * len(MACHINES)


def test_task_failure_is_stable_until_the_retry_annotation_changes(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService
) -> None:
    service = start_service(lab_inventory(MACHINES[:1]))
    host, name = nodes[0], MACHINES[0]
    can_update_machine_set(service.client, OLD, FILES_AND_ARGS)
    faults.fail_next(lab, host, "systemctl")  # the kubelet restart after the new flags fails once
    first = poll_update_machine(service.client, name, FILES_AND_ARGS)
    assert first.status == "Failure"
    assert re.fullmatch(r'kubelet_args: task "[^"{}]+" failed on host', first.message), first.message
    for _ in range(2):  # CAPI backs off and calls again: the same answer, no new run
        again = poll_update_machine(service.client, name, FILES_AND_ARGS)
        assert (again.status, again.message, again.calls) == ("Failure", first.message, 1)
    assert len(attempts(service.runs_dir, name)) == 1
    assert stamp_writes(lab, host) == []
    retried = poll_update_machine(service.client, name, FILES_AND_ARGS, {RETRY: "1"})
    assert (retried.status, retried.message) == ("Success", "update applied"), retried.messages
    assert len(attempts(service.runs_dir, name)) == 2
    assert "--max-pods=130" in run_on(lab, host, ["cat", "/etc/default/kubelet"])
    assert len(stamp_writes(lab, host)) == 1


LEFT = "/etc/e2e/left-by-a-failed-run.conf"


def test_files_of_a_failed_run_are_removed_by_the_next_desired_state(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService
) -> None:
    """The file step writes one file and fails on the next: a later desired state without that file
    (a new fingerprint, as after the user fixes the template) removes it."""
    service = start_service(lab_inventory(MACHINES[:1]))
    host, name = nodes[0], MACHINES[0]
    failing = NodeSpec(
        START_VERSION,
        {
            "files": [
                {"path": LEFT, "content": "stale\n", "owner": "root:root", "permissions": "0644"},
                # its parent is a file: cannot be written, after the first one was
                {
                    "path": "/etc/passwd/cannot.conf",
                    "content": "x\n",
                    "owner": "root:root",
                    "permissions": "0644",
                },
            ],
            "joinConfiguration": kubelet_args(("max-pods", "110")),
        },
    )
    can_update_machine_set(service.client, OLD, failing)
    first = poll_update_machine(service.client, name, failing)
    assert first.status == "Failure" and first.message.startswith("kubeadm_files: "), first.messages
    assert run_on(lab, host, ["cat", LEFT]) == "stale\n"
    can_update_machine_set(service.client, OLD, FILES_AND_ARGS)
    fixed = poll_update_machine(service.client, name, FILES_AND_ARGS)
    assert (fixed.status, fixed.message) == ("Success", "update applied"), fixed.messages
    assert run_on(lab, host, ["cat", "/etc/e2e/small.conf"]) == "small\n"
    assert lab.exec_in(host, ["test", "-e", LEFT]).returncode != 0, "the failed run's file stayed unmanaged"


def test_link_down_is_retried_and_converges_when_back(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService
) -> None:
    # a budget this test cannot spend: how many attempts fail before the link is back depends on load
    service = start_service(lab_inventory(MACHINES[:1]), extra_args=["--max-failed-attempts", "20"])
    host, name = nodes[0], MACHINES[0]
    can_update_machine_set(service.client, OLD, FILES_AND_ARGS)
    faults.link(lab, host, up=False)
    try:
        down = poll_update_machine(
            service.client, name, FILES_AND_ARGS, within=120, until=lambda m: m.startswith("host unreachable")
        )
        assert down.status == "Success", down.messages  # retriable: CAPI keeps calling, no Failure
        # each call after the backoff is one more attempt; how many passed before this poll depends on load
        retrying = re.fullmatch(r"host unreachable, retrying \(attempt (\d+)\)", down.message)
        assert retrying is not None and int(retrying[1]) >= 2, down.message
        assert all(m.startswith(("running:", "queued:")) for m in down.messages[:-1]), down.messages
    finally:
        faults.link(lab, host, up=True)
    back = poll_update_machine(service.client, name, FILES_AND_ARGS, within=180)
    assert (back.status, back.message) == ("Success", "update applied"), back.messages
    assert len(stamp_writes(lab, host)) == 1
    assert len(attempts(service.runs_dir, name)) >= 2


def test_an_unreachable_host_is_blocked_after_the_retry_budget_until_the_retry_annotation(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService
) -> None:
    service = start_service(lab_inventory(MACHINES[:1]), extra_args=["--max-failed-attempts", "2"])
    host, name = nodes[0], MACHINES[0]
    can_update_machine_set(service.client, OLD, FILES_AND_ARGS)
    faults.link(lab, host, up=False)
    try:
        blocked = poll_update_machine(service.client, name, FILES_AND_ARGS, within=180)
        assert (blocked.status, blocked.message) == (
            "Failure",
            "blocked after 2 failed attempts: host unreachable",
        ), blocked.messages
        again = poll_update_machine(service.client, name, FILES_AND_ARGS)
        assert (again.status, again.message, again.calls) == ("Failure", blocked.message, 1)
        assert len(attempts(service.runs_dir, name)) == 2, "no third attempt"
    finally:
        faults.link(lab, host, up=True)
    still = poll_update_machine(service.client, name, FILES_AND_ARGS)
    assert (still.status, still.message) == ("Failure", blocked.message), "the host is back: still blocked"
    retried = poll_update_machine(service.client, name, FILES_AND_ARGS, {RETRY: "1"})
    assert (retried.status, retried.message) == ("Success", "update applied"), retried.messages
    assert len(attempts(service.runs_dir, name)) == 3
    assert len(stamp_writes(lab, host)) == 1


def test_sigkill_mid_run_then_restart_applies_exactly_once(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService, tmp_path: Path
) -> None:
    inventory = lab_inventory(MACHINES)
    runs_dir = tmp_path / "runs-shared"
    first = start_service(inventory, runs_dir, name="first")
    can_update_machine_set(first.client, OLD, FULL)
    # CAPI calls each Machine, honouring retryAfterSeconds, until the first one reports a running role
    running = {progress.running(capability) for capability in CAPABILITIES}
    seen = poll_all(first.client, FULL, MACHINES, within=120, until=lambda m: m in running)
    assert all(p.status == "Success" for p in seen.values()), seen
    assert any(p.message != "update applied" for p in seen.values()), seen  # killed mid-run
    first.kill()
    second = start_service(inventory, runs_dir, name="second")
    results = poll_all(second.client, FULL, MACHINES, within=400)
    for name, host in zip(MACHINES, nodes, strict=True):
        assert (results[name].status, results[name].message) == ("Success", "update applied"), results[name]
        writes = stamp_writes(lab, host)
        assert len(writes) == 1, writes  # exactly one successful apply per fingerprint
        assert not overlapping_holders(lock_events(lab, host))
        assert NEXT_VERSION in run_on(lab, host, ["kubelet", "--version"])


def _kill_plays(runs_dir: Path) -> int:
    """SIGKILL every process group of a play of ``runs_dir`` (detach.py and ansible-playbook with its
    forked workers), as the end of a pod does: returns how many groups were killed."""
    groups = set()
    for pid_dir in Path("/proc").iterdir():
        try:
            cmdline = (pid_dir / "cmdline").read_bytes() if pid_dir.name.isdigit() else b""
        except OSError:
            continue
        if b"ansible-playbook" in cmdline and str(runs_dir).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(int(pid_dir.name)))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    return len(groups)


def test_a_play_killed_with_its_service_is_taken_over_at_once_by_the_next_attempt(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService, tmp_path: Path
) -> None:
    """The pod dies with its play mid-role: the lock it held is not waited out (300 s wait, 1800 s stale),
    the restarted service's attempt of the same Machine takes it over at once and applies it once."""
    name, host = MACHINES[0], nodes[0]
    inventory = lab_inventory([name])
    runs_dir = tmp_path / "runs-shared"
    first = start_service(inventory, runs_dir, name="first")
    can_update_machine_set(first.client, OLD, FULL)
    running = re.compile(r"running: (" + "|".join(CAPABILITIES) + ")")
    seen = poll_update_machine(
        first.client, name, FULL, within=120, until=lambda m: bool(running.fullmatch(m))
    )
    assert running.fullmatch(seen.message), seen.messages
    first.kill()
    assert _kill_plays(runs_dir) >= 1
    # the dead play took the lock and never stamped: without a takeover the host stays locked
    assert lab.exec_in(host, ["test", "-d", f"{STATE_DIR}/lock"]).returncode == 0
    assert stamp_writes(lab, host) == []

    second = start_service(inventory, runs_dir, name="second")
    restarted = time.monotonic()
    done = poll_update_machine(second.client, name, FULL, within=120)
    elapsed = time.monotonic() - restarted
    assert (done.status, done.message) == ("Success", "update applied"), done.messages
    assert len(stamp_writes(lab, host)) == 1
    entries = lock_log(lab, host)
    takeover = [e for e in entries if e["event"] == "took-over"]
    assert [(e["reason"], e["previous"]) for e in takeover] == [
        ("own-dead-attempt", e2e_ident(runs_dir, name))
    ]
    # the new attempt never queued behind the dead one's lock: it took it on its first look
    assert [e["event"] for e in entries[-3:]] == ["took-over", "acquired", "released"], entries
    assert not any(e["event"] == "waiting" for e in entries), entries
    # one retry interval (1 s here) plus the play: the second play's own span on the host bounds it
    play = entries[-1]["time"] - entries[-3]["time"]
    assert elapsed < 1 + play + 30, (elapsed, play)


def e2e_ident(runs_dir: Path, name: str) -> str:
    (ident_dir,) = runs_dir.glob(f"e2e.{name}.*")
    return ident_dir.name


def test_two_services_never_update_one_host_at_once(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService
) -> None:
    inventory = lab_inventory(MACHINES)
    one = start_service(inventory, name="one")
    two = start_service(inventory, name="two")
    can_update_machine_set(one.client, OLD, FILES_AND_ARGS)
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(poll_all, one.client, FILES_AND_ARGS, MACHINES)
        b = pool.submit(poll_all, two.client, FILES_AND_ARGS, MACHINES)
        results = [a.result(), b.result()]
    for polled in results:
        assert all((p.status, p.message) == ("Success", "update applied") for p in polled.values()), polled
    for host in nodes:
        events = lock_events(lab, host)
        assert events.count("acquired") == 2, events  # both services' runs took the lock, one after the other
        assert not overlapping_holders(events), events
        assert len(stamp_writes(lab, host)) == 1
