"""``plan --hosts`` (the host dry run, issue 41) on the lab's real nodes: systemd, containerd and the real
kubelet joined with ``kubeadm join`` (see conftest.py). A change of a file, a kubelet flag and the
Kubernetes version is checked on two nodes and a third Machine that cannot be reached: the node at the
old state shows exactly those differences, the node whose stamp already holds the update shows
``unchanged``, the unreachable one its error, and afterwards both nodes are as they were to the byte:
the files, their mtimes, the state directory (no stamp written, no lock left) and the kubelet's systemd
MainPID (no restart).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hostlab.inventory import service_inventory
from hostlab.lab import Host

from inplace_extension.cli import main

from .conftest import NODES, REPO, START, TARGET, Cluster, capabilities
from .images import node_image
from .operator import jobs_namespace as prepared_namespace
from .test_node_capabilities import kubelet_pid, on_node

pytestmark = [pytest.mark.lab, pytest.mark.kube]

EXAMPLES = REPO / "examples" / "plan"
STATE_DIR = "/var/lib/inplace-extension"
STAMP = f"{STATE_DIR}/stamp.json"
KUBELET_FLAGS = "/etc/default/kubelet"  # the kubelet_args role's file (its defaults)
# what the update would touch on a node: its files, the binaries the version step swaps
WATCHED = ("/etc/motd", KUBELET_FLAGS, "/usr/bin/kubelet", "/usr/bin/kubeadm")


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in os.environ if name.startswith("INPLACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def kubelet_version(cluster: Cluster, host: Host) -> str:
    return on_node(cluster, host, "kubelet", "--version").strip().removeprefix("Kubernetes ")


def snapshot(cluster: Cluster, host: Host) -> str:
    """Each watched file's name, size, mtime (ns), mode and owner and checksum, the state directory's
    listing with sizes and mtimes, and the kubelet's MainPID."""
    script = (
        f"for f in {' '.join(WATCHED)}; do [ -e $f ] && stat -c '%n %s %.9Y %a %u' $f && md5sum $f; done; "
        f"[ -d {STATE_DIR} ] && find {STATE_DIR} -printf '%p %s %T@\\n' | sort; true"
    )
    return on_node(cluster, host, "sh", "-c", script) + f"kubelet MainPID {kubelet_pid(cluster, host)}\n"


@pytest.fixture
def kept_stamp(node_cluster: Cluster) -> Iterator[Host]:
    """A node whose stamp the test replaces; its own stamp (or none) is put back afterwards: the later
    tests of the node lab update this node and read its stamp."""
    host = node_cluster.hosts[2]
    before = node_cluster.lab.exec_in(host, ["cat", STAMP])
    yield host
    if before.returncode == 0:
        node_cluster.lab.exec_in(host, ["sh", "-c", f"cat >{STAMP}"], input_text=before.stdout)
    else:
        node_cluster.lab.exec_in(host, ["rm", "-f", STAMP])


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_dry_run_on_real_nodes_shows_the_differences_and_leaves_each_node_as_it_was(
    node_cluster: Cluster, kept_stamp: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dry_run_on_three_machines(node_cluster, kept_stamp, tmp_path, capsys, ())


def test_the_dry_run_through_the_kubernetes_executor_checks_each_host_in_a_job(
    node_cluster: Cluster, kept_stamp: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same three Machines and the same answers, each host checked by a Job of the project's image
    (run by the real Job controller on a real node, playing over SSH through the Pod network); every
    check Job deleted once read."""
    image = node_image(node_cluster)
    with prepared_namespace(node_cluster.kube) as namespace:
        executor = (
            "--executor", "kubernetes", "--kubeconfig", str(node_cluster.kube.kubeconfig),
            "--job-namespace", namespace, "--job-image", image, "--job-deadline-seconds", "300",
            "--job-playbooks-dir", "/opt/inplace-extension/playbooks",
        )  # fmt: skip
        dry_run_on_three_machines(node_cluster, kept_stamp, tmp_path, capsys, executor)
        # the Jobs ran: the job controller made a Pod for each of three check Jobs (its Events outlive
        # them), and each Job and its Secret is gone
        listed = node_cluster.kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
        made = {
            event["involvedObject"]["name"]
            for event in json.loads(listed)["items"]
            if event["involvedObject"]["kind"] == "Job" and event["reason"] == "SuccessfulCreate"
        }
        assert len(made) == 3 and all(name.startswith("inplace-dry-run-") for name in made), made
        left = node_cluster.kube.kubectl("get", "jobs,secrets", "-n", namespace, "-o", "name").stdout
        assert "inplace-dry-run-" not in left, left


def dry_run_on_three_machines(
    cluster: Cluster,
    stamped: Host,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    executor: tuple[str, ...],
) -> None:
    """The dry run of a file, a kubelet flag and the version change on three Machines (a node at the old
    state, ``stamped`` whose stamp holds the change, and one that cannot be reached) with ``executor``'s
    flags; asserts the answers and that both nodes are unchanged to the byte."""
    # the node to check at the old state: one whose kubelet runs the first node version (the tests
    # before this one may have upgraded some)
    fresh = next((h for h in cluster.hosts[:2] if kubelet_version(cluster, h) == START), None)
    assert fresh is not None, f"a node at {START} among the first two of {NODES}"
    # the examples of `plan`, at the node lab's versions: a file, a kubelet flag and the version change
    old = tmp_path / "old.yaml"
    new = tmp_path / "new.yaml"
    old.write_text((EXAMPLES / "capi-old.yaml").read_text().replace("v1.30.0", START))
    new.write_text((EXAMPLES / "capi-new.yaml").read_text().replace("v1.31.0", TARGET))
    names = ("md-0-fresh", "md-0-stamped", "md-0-away")
    inventory = service_inventory(cluster.lab, None)
    by_name = {entry["address"]: entry for entry in inventory["hosts"]}
    entries = [dict(by_name[fresh.address]), dict(by_name[stamped.address]), dict(by_name[fresh.address])]
    for entry, name in zip(entries, names, strict=True):
        entry["match"] = {"name": name}
    entries[2]["port"] = 1  # nothing listens there: the third Machine cannot be reached
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({"hosts": entries}))
    (tmp_path / "capabilities.yaml").write_text(capabilities(cluster))
    args = (
        "--old", str(old), "--new", str(new), *(f"--machine={name}" for name in names),
        "--inventory", str(tmp_path / "inventory.yaml"), "--allowed-cidrs", str(cluster.lab.network),
        "--playbooks-dir", str(REPO / "playbooks"),
        "--capabilities-file", str(tmp_path / "capabilities.yaml"),
    )  # fmt: skip
    code, out, err = plan(capsys, *args, "-o", "json")
    assert code == 0, err
    preview = json.loads(out)
    steps = {step["capability"]: step["fingerprint"] for step in preview["steps"]}
    assert set(steps) == {"kubeadm_files", "kubelet_args", "kubernetes_version"}, steps
    # the second node's stamp holds this very update, as a complete run of it leaves the stamp
    stamp = {"fingerprint": preview["fingerprint"], "ident": "earlier", "applied_at": 1, "steps": steps}
    cluster.lab.exec_in(
        stamped, ["sh", "-c", f"mkdir -p {STATE_DIR} && cat >{STAMP}"], input_text=json.dumps(stamp)
    )
    before = {host.name: snapshot(cluster, host) for host in (fresh, stamped)}

    code, out, err = plan(capsys, *args, *executor, "--hosts", "-o", "json")

    assert code == 1, (out, err)  # the unreachable Machine's error wins over the changes
    checks = {m["name"]: m["check"] for m in json.loads(out)["machines"]}
    a, b, c = (checks[f"default/{name}"] for name in names)
    assert a["result"] == "would change", a
    by_step = {step["capability"]: step for step in a["steps"]}
    assert {s: by_step[s]["result"] for s in by_step} == dict.fromkeys(steps, "would change"), a
    motd = "\n".join(by_step["kubeadm_files"]["diffs"])
    assert "/etc/motd" in motd and "+updated in place" in motd, motd
    flags = "\n".join(by_step["kubelet_args"]["diffs"])
    assert KUBELET_FLAGS in flags and "--max-pods=120" in flags, flags
    assert [line.split(" -> ")[1] for line in by_step["kubelet_args"]["changes"]] == ["--max-pods=120"]
    assert by_step["kubernetes_version"]["changes"] == [f"Kubernetes {START} -> {TARGET}"], by_step
    assert b["result"] == "unchanged", b
    assert {step["result"] for step in b["steps"]} == {"unchanged"}, b
    assert c["result"] == "error" and c["error"].startswith("unreachable"), c
    # each node as it was: files, mtimes, the state directory (no stamp, no lock), the kubelet's MainPID
    for host in (fresh, stamped):
        assert snapshot(cluster, host) == before[host.name], host.name
    assert kubelet_version(cluster, fresh) == START
