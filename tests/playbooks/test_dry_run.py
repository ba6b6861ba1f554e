"""``plan --hosts``, the host dry run, on lab hosts over real SSH: the update playbook in check mode with
diff through the ``local`` executor's play machinery, three Machines in one play.

``kubelet``, ``kubeadm`` and ``systemctl`` on the hosts are STAND-INS (standins.py): the kubelet's
"MainPID" here is the stand-in kubelet's pid file. The real-node proof (a systemd kubelet) and the
``kubernetes`` executor (the check as a Job) are not covered here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostlab.inventory import service_inventory
from hostlab.lab import Host, Lab

from inplace_extension.cli import main

from .standins import install_standins, lab_run_on_host
from .support import REPO, STATE_DIR, calls, host_root

pytestmark = pytest.mark.lab

EXAMPLES = REPO / "examples" / "plan"
MACHINES = ("md-0-a", "md-0-b", "md-0-c")
KUBELET_PID = "/run/inplace-standins-kubelet.pid"
# what the update touches on a host, and what a run leaves behind
WATCHED = ("/etc/motd", "/etc/default/kubelet", "/usr/bin/kubelet", "/usr/bin/kubeadm", KUBELET_PID)


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in os.environ if name.startswith("INPLACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def snapshot(lab: Lab, host: Host) -> str:
    """Every watched file's and the state dir's names, sizes, mtimes and checksums, and the kubelet's pid."""
    script = (
        f"for f in {' '.join(WATCHED)}; do [ -e $f ] && stat -c '%n %s %Y %a %u' $f && md5sum $f; done; "
        f"[ -d {STATE_DIR} ] && find {STATE_DIR} -printf '%p %s %T@\\n' | sort; "
        f"cat {KUBELET_PID}; true"
    )
    return host_root(lab, host, ["sh", "-c", script])


def write_stamp(lab: Lab, host: Host, stamp: dict[str, Any]) -> None:
    """The stamp a complete run of the update leaves (inplace_lock_stamp's stamp.json)."""
    host_root(
        lab, host, ["sh", "-c", f"mkdir -p {STATE_DIR} && cat >{STATE_DIR}/stamp.json"], json.dumps(stamp)
    )


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_dry_run_changes_nothing_and_tells_each_host_what_it_would_get(
    lab: Lab, lab_hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh, stamped = lab_hosts[:2]  # the third host is reached at a port where nothing listens
    for host in (fresh, stamped):
        install_standins(lab_run_on_host(lab, host), version="v1.30.2")
    inventory = service_inventory(lab, MACHINES)
    inventory["hosts"][2]["port"] = 1  # nothing listens there: the third host is unreachable
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump(inventory))
    args = (
        "--old",
        str(EXAMPLES / "capi-old.yaml"),
        "--new",
        str(EXAMPLES / "capi-new.yaml"),
        *(f"--machine={name}" for name in MACHINES),
        "--inventory",
        str(inventory_file),
        "--allowed-cidrs",
        f"{lab.network}",
    )
    # the second host's stamp holds this very update, as a complete run leaves it
    code, out, err = plan(capsys, *args, "-o", "json")
    assert code == 0, err
    preview = json.loads(out)
    steps = {step["capability"]: step["fingerprint"] for step in preview["steps"]}
    assert set(steps) == {"kubeadm_files", "kubelet_args", "kubernetes_version"}
    stamp = {"fingerprint": preview["fingerprint"], "ident": "earlier", "applied_at": 1, "steps": steps}
    host_root(
        lab, stamped, ["sh", "-c", f"mkdir -p {STATE_DIR} && cat >{STATE_DIR}/stamp.json"], json.dumps(stamp)
    )
    before = {host.name: snapshot(lab, host) for host in (fresh, stamped)}
    called = {host.name: calls(lab, host) for host in (fresh, stamped)}

    code, out, err = plan(capsys, *args, "--hosts", "-o", "json")

    assert code == 1, (out, err)  # an error (the unreachable host) wins over the changes
    checks = {m["name"]: m["check"] for m in json.loads(out)["machines"]}
    a, b, c = (checks[f"default/{name}"] for name in MACHINES)
    assert a["result"] == "would change", a
    by_step = {step["capability"]: step for step in a["steps"]}
    assert {s: by_step[s]["result"] for s in by_step} == dict.fromkeys(steps, "would change")
    motd = "\n".join(by_step["kubeadm_files"]["diffs"])
    assert "+updated in place" in motd and "/etc/motd" in motd, motd
    flags = "\n".join(by_step["kubelet_args"]["diffs"])
    assert "--max-pods=120" in flags and "/etc/default/kubelet" in flags, flags
    assert [line.split(" -> ")[1] for line in by_step["kubelet_args"]["changes"]] == ["--max-pods=120"]
    assert by_step["kubernetes_version"]["changes"] == ["Kubernetes v1.30.2 -> v1.31.0"]
    assert b["result"] == "unchanged", b
    assert {step["result"] for step in b["steps"]} == {"unchanged"}
    assert c["result"] == "error" and c["error"].startswith("unreachable"), c
    # nothing changed on the hosts: files, mtimes, the state dir (no stamp, no lock), the kubelet's pid,
    # and no stand-in was called but to read its version (no restart, no kubeadm)
    for host in (fresh, stamped):
        assert snapshot(lab, host) == before[host.name], host.name
        new_calls = calls(lab, host)[len(called[host.name]) :]
        assert all(call.endswith(" --version") for call in new_calls), new_calls  # reads only
    assert "lock" not in before[fresh.name] + before[stamped.name]

    # the table: one line per Machine, then the differences
    code, out, err = plan(capsys, *args, "--hosts")
    assert code == 1, err
    lines = out.splitlines()
    assert any(line.startswith("default/md-0-a") and "would change" in line for line in lines), out
    assert any(line.startswith("default/md-0-b") and "unchanged" in line for line in lines), out
    assert any(line.startswith("default/md-0-c") and "ERROR" in line for line in lines), out
    assert "+updated in place" in out


def test_a_saved_update_request_with_every_step_held_by_the_stamp_exits_0(
    lab: Lab, lab_hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = lab_hosts[0]
    install_standins(lab_run_on_host(lab, host), version="v1.30.2")
    request = REPO / "tests" / "fixtures" / "capi" / "update_machine" / "6B.request.json"
    name = json.loads(request.read_text())["desired"]["machine"]["metadata"]["name"]
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump(service_inventory(lab, [name])))
    args = (str(request), "--inventory", str(inventory_file), "--allowed-cidrs", f"{lab.network}")
    code, out, err = plan(capsys, *args, "--hosts", "-o", "yaml")
    assert code == 2, err  # changes
    check: dict[str, Any] = yaml.safe_load(out)["machines"][0]["check"]
    assert check["result"] == "would change", check
    preview = json.loads(plan(capsys, *args, "-o", "json")[1])
    stamp = {
        "fingerprint": preview["fingerprint"],
        "steps": {s["capability"]: s["fingerprint"] for s in preview["steps"]},
    }
    host_root(
        lab, host, ["sh", "-c", f"mkdir -p {STATE_DIR} && cat >{STATE_DIR}/stamp.json"], json.dumps(stamp)
    )
    code, out, err = plan(capsys, *args, "--hosts", "-o", "json")
    assert code == 0, (out, err)
    assert json.loads(out)["machines"][0]["check"]["result"] == "unchanged"


USERS_OLD = """
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata: {name: md-0-v1, namespace: default}
spec:
  template:
    spec: {}
"""
USERS_NEW = """
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata: {name: md-0-v2, namespace: default}
spec:
  template:
    spec:
      users:
        - name: alice
          groups: dryrunners
          sudo: "ALL=(ALL) NOPASSWD:ALL"
          sshAuthorizedKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDryRun alice"]
      ntp: {enabled: true, servers: [ntp1.example.org, ntp2.example.org]}
"""
USERS_WATCHED = (
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/sudoers.d",
    "/etc/systemd/timesyncd.conf.d",
    "/etc/chrony",
    STATE_DIR,
)


def test_users_and_ntp_tell_what_they_would_add_and_change_nothing(
    lab: Lab, lab_hosts: list[Host], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = lab_hosts[0]
    (tmp_path / "old.yaml").write_text(USERS_OLD)
    (tmp_path / "new.yaml").write_text(USERS_NEW)
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump(service_inventory(lab, ["md-0-a"])))
    listing = f"find {' '.join(USERS_WATCHED)} -printf '%p %s %T@\\n' 2>/dev/null | sort; md5sum /etc/passwd"
    before = host_root(lab, host, ["sh", "-c", f"{listing}; true"])
    code, out, err = plan(
        capsys,
        "--old",
        str(tmp_path / "old.yaml"),
        "--new",
        str(tmp_path / "new.yaml"),
        "--machine=md-0-a",
        "--inventory",
        str(inventory_file),
        "--allowed-cidrs",
        f"{lab.network}",
        "--hosts",
        "-o",
        "json",
    )
    assert code == 2, (out, err)
    check = json.loads(out)["machines"][0]["check"]
    steps = {step["capability"]: step for step in check["steps"]}
    assert steps["users"]["result"] == "would change", steps["users"]
    changes = steps["users"]["changes"]
    assert "group dryrunners added" in changes, changes
    assert "user alice added: groups dryrunners" in changes, changes
    assert "user alice: 1 SSH authorized key(s)" in changes, changes
    assert any(line.startswith("sudo rule ") and "NOPASSWD" in line for line in changes), changes
    assert steps["ntp"]["result"] == "would change", steps["ntp"]
    ntp = "\n".join(steps["ntp"]["diffs"])
    assert "ntp1.example.org" in ntp and "ntp2.example.org" in ntp, ntp
    assert host_root(lab, host, ["sh", "-c", f"{listing}; true"]) == before
    assert lab.exec_in(host, ["id", "alice"]).returncode != 0
