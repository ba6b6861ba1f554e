"""Every host-side capability on real Kubernetes nodes, through the real service (see conftest.py).

The nodes joined the lab's apiserver with ``kubeadm join``: their kubelet runs under systemd with
kubeadm's kubelet.conf, pki directory and config.yaml. Each test drives UpdateMachine as CAPI does
(tests/e2e/capi.py) and then reads the real Node and the real services.
"""

from __future__ import annotations

import json
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from e2e.capi import NodeSpec, can_update_machine_set, poll_update_machine
from hostlab.lab import Host
from hostlab.proc import wait_until
from kubelab import node_join
from playbooks.shipped import ANNOTATION, install_os_update_standin, set_mode, standin_calls

from .conftest import (
    JOIN_VERSIONS,
    MINOR,
    START,
    TARGET,
    Cluster,
    StartService,
    kube_aware_args,
    provisioned_machine,
)

pytestmark = [pytest.mark.lab, pytest.mark.kube]


def node(cluster: Cluster, host: Host) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cluster.kube.kubectl("get", "node", host.name, "-o", "json").stdout)
    return data


def ready(cluster: Cluster, host: Host) -> bool:
    return node_join.node_ready(cluster.kube, host.name)


def on_node(cluster: Cluster, host: Host, *argv: str) -> str:
    result = cluster.lab.exec_in(host, list(argv))
    assert result.returncode == 0, f"{argv} on {host.name}: {result.stderr}"
    return result.stdout


def kubelet_pid(cluster: Cluster, host: Host) -> int:
    return int(on_node(cluster, host, "systemctl", "show", "-p", "MainPID", "--value", "kubelet").strip())


def client_cert_serial(cluster: Cluster, host: Host) -> int:
    pem = on_node(cluster, host, "cat", "/var/lib/kubelet/pki/kubelet-client-current.pem").encode()
    return x509.load_pem_x509_certificate(pem).serial_number


def stamp_writes(cluster: Cluster, host: Host) -> int:
    """How many stamps were written on the node (stamp.log: one line each; none before the first)."""
    log = cluster.lab.exec_in(host, ["cat", "/var/lib/inplace-extension/stamp.log"])
    return len(log.stdout.splitlines()) if log.returncode == 0 else 0


def kubelet_args(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "joinConfiguration": {
            "nodeRegistration": {"kubeletExtraArgs": [{"name": k, "value": v} for k, v in pairs]}
        }
    }


def test_the_nodes_joined_with_kubeadm_and_are_ready(node_cluster: Cluster) -> None:
    for host, version in zip(node_cluster.hosts, JOIN_VERSIONS, strict=True):
        info = node(node_cluster, host)["status"]["nodeInfo"]
        assert info["kubeletVersion"] == version
        assert info["containerRuntimeVersion"].startswith("containerd://")
        assert info["osImage"].startswith("Debian GNU/Linux 12")
        assert ready(node_cluster, host)
        # what kubeadm join writes: the kubelet's kubeconfig names its client certificate by path
        assert "/var/lib/kubelet/pki/kubelet-client-current.pem" in on_node(
            node_cluster, host, "cat", "/etc/kubernetes/kubelet.conf"
        )
        assert "failCgroupV1: false" in on_node(node_cluster, host, "cat", "/var/lib/kubelet/config.yaml")


def test_kubelet_credentials_rotation_rebootstraps_the_real_kubelet(
    node_cluster: Cluster, node_service: StartService
) -> None:
    host = node_cluster.hosts[0]
    serial = client_cert_serial(node_cluster, host)
    service = node_service()
    spec = NodeSpec(START)
    polled = poll_update_machine(service.client, host.name, spec, {ANNOTATION: "2026-11-25T20:00:00Z"})
    assert (polled.status, polled.message) == ("Success", "update applied"), polled.messages
    # the kubelet bootstrapped again with the embedded certificate: a new client certificate, signed
    # for its own Node by the cluster, and the Node stays Ready
    assert client_cert_serial(node_cluster, host) != serial
    assert wait_until(lambda: ready(node_cluster, host), 60, 1)
    assert on_node(node_cluster, host, "systemctl", "is-active", "kubelet").strip() == "active"
    csrs = json.loads(node_cluster.kube.kubectl("get", "csr", "-o", "json").stdout)["items"]
    mine = [c for c in csrs if c["spec"]["username"] == f"system:node:{host.name}"]
    assert mine and all(c["status"].get("certificate") for c in mine)


def test_kubelet_args_files_users_and_ntp_on_a_real_node(
    node_cluster: Cluster, node_service: StartService, tmp_path: Path
) -> None:
    host = node_cluster.hosts[1]
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    old = NodeSpec(START, kubelet_args(("max-pods", "110")))
    new = NodeSpec(
        START,
        {
            "files": [
                {"path": "/etc/nodes-test/hello.conf", "content": "hello $(id)\n", "permissions": "0640"}
            ],
            "users": [
                {
                    "name": "nodeuser",
                    "shell": "/bin/bash",
                    "sshAuthorizedKeys": [key.with_suffix(".pub").read_text().strip()],
                }
            ],
            "ntp": {"enabled": True, "servers": ["ntp1.example.org", "ntp2.example.org"]},
            **kubelet_args(("max-pods", "42")),
        },
    )
    before = kubelet_pid(node_cluster, host)
    service = node_service()
    can_update_machine_set(service.client, old, new)
    polled = poll_update_machine(service.client, host.name, new)
    assert (polled.status, polled.message) == ("Success", "update applied"), polled.messages
    # kubelet_args: systemd restarted the real kubelet with the flag, the Node reports it
    assert kubelet_pid(node_cluster, host) != before
    assert "--max-pods=42" in " ".join(
        on_node(node_cluster, host, "cat", f"/proc/{kubelet_pid(node_cluster, host)}/cmdline").split("\0")
    )
    assert wait_until(lambda: node(node_cluster, host)["status"]["capacity"]["pods"] == "42", 60, 1)
    # a restarted kubelet first posts Ready=False ("container runtime status check may not have
    # completed yet"), so the Node's return to Ready is waited for, not read once
    assert wait_until(lambda: ready(node_cluster, host), 60, 1)
    # files: the literal content, never run by a shell
    assert on_node(node_cluster, host, "cat", "/etc/nodes-test/hello.conf") == "hello $(id)\n"
    # users: the node's real sshd lets the new user in with its key
    login = node_cluster.lab.ssh_argv(host, "nodeuser")
    login[login.index("-i") + 1] = str(key)
    assert (
        subprocess.run([*login, "--", "id", "-un"], capture_output=True, text=True, timeout=30).stdout
        == "nodeuser\n"
    )
    # ntp: the real systemd-timesyncd was restarted with the servers
    servers = on_node(
        node_cluster, host, "timedatectl", "show-timesync", "--property=SystemNTPServers", "--value"
    )
    assert servers.split() == ["ntp1.example.org", "ntp2.example.org"]


@pytest.mark.parametrize(
    ("index", "joined", "kube_aware"),
    [(2, START, False), (3, MINOR, True)],
    ids=["patch", "minor-kube-aware"],
)
def test_kubernetes_version_upgrade_with_kubeadm_upgrade_node(
    node_cluster: Cluster, node_service: StartService, index: int, joined: str, kube_aware: bool
) -> None:
    """The patch upgrade in plain mode, the minor upgrade in the Kubernetes-aware mode (its Machine as in
    test_node_kube_aware.py): there the health gate answers only once the real Node reports the target."""
    host = node_cluster.hosts[index]
    assert node(node_cluster, host)["status"]["nodeInfo"]["kubeletVersion"] == joined
    with ExitStack() as stack:
        extra_args: list[str] = []
        if kube_aware:
            stack.enter_context(provisioned_machine(node_cluster, host))
            extra_args = kube_aware_args(node_cluster)
        service = node_service(extra_args=extra_args)
        can_update_machine_set(service.client, NodeSpec(joined), NodeSpec(TARGET))
        polled = poll_update_machine(service.client, host.name, NodeSpec(TARGET), within=600)
        assert (polled.status, polled.message) == ("Success", "update applied"), polled.messages
        if kube_aware:  # read once, right after the answer: the gate waited for it
            reported = node(node_cluster, host)
            assert reported["status"]["nodeInfo"]["kubeletVersion"] == TARGET
            assert not reported["spec"].get("unschedulable")
    assert on_node(node_cluster, host, "kubelet", "--version").strip() == f"Kubernetes {TARGET}"
    assert on_node(node_cluster, host, "kubeadm", "version", "-o", "short").strip() == TARGET
    assert wait_until(
        lambda: node(node_cluster, host)["status"]["nodeInfo"]["kubeletVersion"] == TARGET, 60, 1
    )
    assert wait_until(lambda: ready(node_cluster, host), 60, 1)


@pytest.mark.parametrize(
    ("mode", "version", "status", "message"),
    [
        ("ok", "1.2.0", "Success", "update applied"),
        ("rollback", "1.3.0", "Failure", 'os_update: task "Rolled back to 1.0.0" failed on host'),
    ],
)
def test_os_update_reboots_the_real_node_and_our_state_survives(
    node_cluster: Cluster, node_service: StartService, mode: str, version: str, status: str, message: str
) -> None:
    host = node_cluster.hosts[0]
    install_os_update_standin(node_cluster.lab, host, booted="1.0.0")
    set_mode(node_cluster.lab, host, mode)
    image = f"https://images.example/os-{version}.qcow2"
    spec = NodeSpec(START, infrastructure={"kind": "Metal3Machine", "spec": {"image": {"url": image}}})
    old = NodeSpec(
        START,
        infrastructure={
            "kind": "Metal3Machine",
            "spec": {"image": {"url": "https://images.example/os-1.0.0.qcow2"}},
        },
    )
    boot_id = on_node(node_cluster, host, "cat", "/proc/sys/kernel/random/boot_id")
    init = host.pid1
    service = node_service()
    can_update_machine_set(service.client, old, spec)
    polled = poll_update_machine(service.client, host.name, spec)
    assert (polled.status, polled.message) == (status, message), polled.messages
    # a real reboot: a new systemd, a new boot id; our state on the node survived it
    assert host.pid1 != init
    assert on_node(node_cluster, host, "cat", "/proc/sys/kernel/random/boot_id") != boot_id
    assert standin_calls(node_cluster.lab, host)[-1] == f"--image {image} --version {version}"
    assert on_node(node_cluster, host, "test", "-d", "/var/lib/inplace-extension") == ""
    # the kubelet came back with the node (enabled in systemd) and the Node is Ready again
    assert wait_until(lambda: ready(node_cluster, host), 120, 1)


HEALTH_CHECKS = """\
health_checks:
  - name: kubelet
    command: [systemctl, is-active, --quiet, kubelet]
  - name: unit
    command: [systemctl, is-active, --quiet, %s]
"""


@pytest.mark.parametrize(
    ("unit", "status", "message"),
    [
        ("containerd", "Success", "update applied"),
        ("no-such-unit", "Failure", "health gate: check unit: exit status 3"),
    ],
)
def test_health_gate_command_checks_ask_the_real_systemd(
    node_cluster: Cluster, node_service: StartService, unit: str, status: str, message: str
) -> None:
    host = node_cluster.hosts[1]
    spec = NodeSpec(START, {"files": [{"path": f"/etc/nodes-test/{unit}", "content": "x\n"}]})
    stamps = stamp_writes(node_cluster, host)
    service = node_service(HEALTH_CHECKS % unit, ["--health-gate-timeout-seconds", "5"])
    polled = poll_update_machine(service.client, host.name, spec)
    assert (polled.status, polled.message) == (status, message), polled.messages
    assert on_node(node_cluster, host, "cat", f"/etc/nodes-test/{unit}") == "x\n"  # applied before the gate
    # the stamp is written only when every check passed
    assert stamp_writes(node_cluster, host) == stamps + (1 if status == "Success" else 0)
