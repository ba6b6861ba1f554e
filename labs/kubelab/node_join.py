"""Joining lab nodes (:mod:`hostlab.nodes`) to a kubelab with ``kubeadm join``, the way users do it.

On the machine: the lab's apiserver listens on loopback only, so a ``socat`` component forwards the
node lab's gateway (the only address its nodes reach) on the apiserver's port to it; the nodes map
:data:`kubelab.config.APISERVER_NAME` to their gateway. In each node: kubelet and kubeadm at one
version in ``/usr/bin`` with the kubelet units the Kubernetes packages install (``kubelet.service`` and
kubeadm's ``10-kubeadm.conf`` drop-in), then ``kubeadm join`` with the lab's bootstrap token (TLS
bootstrap, the CSR approved and signed by the flavour's controllers). kubeadm writes
``/etc/kubernetes/kubelet.conf``, ``/var/lib/kubelet/pki``, ``/var/lib/kubelet/config.yaml`` and
``kubeadm-flags.env`` as on any kubeadm node. Needs the ``nodes`` flavour on the kubelab.

The lab runs no kube-proxy. A Pod that talks to the API server in-cluster (the ``kubernetes`` Service's
ClusterIP on port 443, the address the kubelet gives it in ``KUBERNETES_SERVICE_HOST``) reaches it through
a **stand-in for kube-proxy**: one iptables DNAT rule in each node, from that ClusterIP and port to the
apiserver's address on the node lab's gateway (the socat forward above), installed by :func:`join` as a
systemd unit of the node (``hostlab-kube-proxy-stand-in.service``), so it is back after every reboot.
It serves only that one Service; no other Service has a ClusterIP that works. The apiserver's serving
certificate names the ClusterIP (:data:`kubelab.core.KUBERNETES_SERVICE_IP`), so TLS verifies as in a
real cluster. The node's CNI bridge masquerades Pods' traffic, so the reply finds its way back.

The lab runs no node lifecycle controller either (it would mark the bare and kwok Nodes of other tests
``Unknown`` and taint them). The apiserver's ``NodeTaint`` admission gives every new Node the
``node.kubernetes.io/not-ready:NoSchedule`` taint, which only that controller removes; so :func:`join`,
a **stand-in for the node lifecycle controller** in this one step, removes it once the kubelet reports
the Node Ready, and the scheduler can place Pods there. Nothing adds it again: a Node that turns
NotReady later keeps accepting Pods.
"""

from __future__ import annotations

import json
import shutil
import socket
from contextlib import suppress
from pathlib import Path

from hostlab.errors import LabError
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until

from kubelab import reads
from kubelab.config import APISERVER_NAME
from kubelab.flavours import nodes
from kubelab.lab import Lab

# As the Kubernetes deb packages install them (kubernetes/release: kubelet.service, 10-kubeadm.conf)
KUBELET_SERVICE = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
KUBEADM_DROPIN = (
    "# Note: This dropin only works with kubeadm and kubelet v1.11+\n"
    "[Service]\n"
    'Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf'
    ' --kubeconfig=/etc/kubernetes/kubelet.conf"\n'
    'Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"\n'
    "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\n"
    "EnvironmentFile=-/etc/default/kubelet\n"
    "ExecStart=\n"
    "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS"
    " $KUBELET_EXTRA_ARGS\n"
)
JOIN_TIMEOUT = 180.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready:NoSchedule"
KUBE_PROXY_STAND_IN = "hostlab-kube-proxy-stand-in"
KUBE_PROXY_STAND_IN_SCRIPT = """\
#!/bin/sh
# STAND-IN for kube-proxy (the lab runs none): the `kubernetes` Service's ClusterIP:port -> the apiserver
# on the node lab's gateway, for Pods (PREROUTING) and host-network processes (OUTPUT). Only this Service.
set -eu
chain=HOSTLAB-KUBE-PROXY-STAND-IN
iptables -w -t nat -N "$chain" 2>/dev/null || iptables -w -t nat -F "$chain"
iptables -w -t nat -A "$chain" -d {cluster_ip}/32 -p tcp --dport {port} -j DNAT --to-destination {target}
for hook in PREROUTING OUTPUT; do
  iptables -w -t nat -C "$hook" -j "$chain" 2>/dev/null || iptables -w -t nat -A "$hook" -j "$chain"
done
"""
KUBE_PROXY_STAND_IN_UNIT = f"""\
[Unit]
Description=hostlab: STAND-IN for kube-proxy (the kubernetes Service's ClusterIP to the apiserver)
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/{KUBE_PROXY_STAND_IN}

[Install]
WantedBy=multi-user.target
"""


def forward_apiserver(kube: Lab, gateway: str) -> None:
    """Make the apiserver reachable on ``gateway`` (same port) for the nodes behind it; idempotent."""
    port = kube.state().ports["apiserver"]
    component = f"apiserver-on-{gateway}"
    existing = kube.state().component(component)
    if existing is not None and existing.running():
        return

    def listening() -> bool:
        with suppress(OSError), socket.create_connection((gateway, port), timeout=1):
            return True
        return False

    socat = shutil.which("socat")
    if socat is None:
        raise LabError("kubelab: socat forwards the apiserver to the nodes (apt-get install socat)")
    argv = [socat, f"TCP-LISTEN:{port},bind={gateway},reuseaddr,fork", f"TCP:127.0.0.1:{port}"]
    kube.start_component(component, argv, ready=listening, timeout=30)


def install_kubernetes(hosts: HostLab, host: Host, kube: Lab, version: str) -> None:
    """kubelet and kubeadm at ``version`` into the node's /usr/bin, with the packages' kubelet units."""
    install_kubelet_kubeadm(hosts, host, kube.binary(f"kubelet-{version}"), kube.binary(f"kubeadm-{version}"))


def install_kubelet_kubeadm(hosts: HostLab, host: Host, kubelet: Path, kubeadm: Path) -> None:
    """The ``kubelet`` and ``kubeadm`` binaries given into the node's /usr/bin, with the packages'
    kubelet units, the unit enabled (not started: kubeadm init or join starts it)."""
    root = host.root()
    for name, binary in (("kubelet", kubelet), ("kubeadm", kubeadm)):
        target = root / "usr/bin" / name
        shutil.copyfile(binary, target)
        target.chmod(0o755)
    (root / "lib/systemd/system/kubelet.service").write_text(KUBELET_SERVICE)
    dropin = root / "etc/systemd/system/kubelet.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "10-kubeadm.conf").write_text(KUBEADM_DROPIN)
    for argv in (["systemctl", "daemon-reload"], ["systemctl", "enable", "kubelet"]):
        result = hosts.exec_in(host, argv)
        if result.returncode != 0:
            raise LabError(f"{host.name}: {' '.join(argv)} failed: {result.stderr.strip()}")


def kubernetes_service(kube: Lab) -> tuple[str, int]:
    """The ``kubernetes`` Service's ClusterIP and port, as the apiserver made it."""
    service = json.loads(kube.kubectl("get", "service", "kubernetes", "-n", "default", "-o", "json").stdout)
    return str(service["spec"]["clusterIP"]), int(service["spec"]["ports"][0]["port"])


def install_kube_proxy_stand_in(kube: Lab, hosts: HostLab, host: Host) -> None:
    """The kube-proxy stand-in (see the module's docstring) into the node, enabled and started."""
    cluster_ip, port = kubernetes_service(kube)
    target = f"{hosts.gateway}:{kube.state().ports['apiserver']}"
    root = host.root()
    script = root / "usr/local/sbin" / KUBE_PROXY_STAND_IN
    script.write_text(KUBE_PROXY_STAND_IN_SCRIPT.format(cluster_ip=cluster_ip, port=port, target=target))
    script.chmod(0o755)
    (root / f"etc/systemd/system/{KUBE_PROXY_STAND_IN}.service").write_text(KUBE_PROXY_STAND_IN_UNIT)
    for argv in (["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", KUBE_PROXY_STAND_IN]):
        result = hosts.exec_in(host, argv)
        if result.returncode != 0:
            raise LabError(f"{host.name}: {' '.join(argv)} failed: {result.stderr.strip()}")


def node_ready(kube: Lab, name: str) -> bool:
    try:
        node = reads.get(kube, "node", name)
    except LabError:
        return False
    if node is None:
        return False
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def join(
    kube: Lab, hosts: HostLab, host: Host, version: str = nodes.START_VERSION, node_name: str | None = None
) -> None:
    """Join ``host`` (a running node) to ``kube`` as the Node ``node_name`` (by default named like the
    host, as ``kubeadm join --node-name`` names it); wait until it is Ready."""
    name = node_name or host.name
    if "nodes" not in kube.state().flavours:
        raise LabError("kubelab: joining nodes needs the 'nodes' flavour on the lab")
    forward_apiserver(kube, hosts.gateway)
    install_kube_proxy_stand_in(kube, hosts, host)
    install_kubernetes(hosts, host, kube, version)
    with (host.root() / "etc/hosts").open("a") as etc_hosts:
        etc_hosts.write(f"{hosts.gateway} {APISERVER_NAME}\n")
    discovery = [
        nodes.endpoint(kube),
        f"--token={nodes.token(kube)}",
        "--discovery-token-unsafe-skip-ca-verification",
    ]
    node = [
        f"--node-name={name}",
        f"--cri-socket={nodes.CONTAINERD_SOCKET}",
        "--ignore-preflight-errors=all",
    ]
    argv = ["kubeadm", "join", *discovery, *node]
    result = hosts.exec_in(host, argv, timeout=JOIN_TIMEOUT)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()[-3000:]
        raise LabError(f"{host.name}: kubeadm join failed: {detail}")
    if not wait_until(lambda: node_ready(kube, name), JOIN_TIMEOUT, 1.0):
        status = hosts.exec_in(host, ["journalctl", "-u", "kubelet", "-n", "30", "--no-pager"]).stdout
        raise LabError(f"{host.name}: Node not Ready within {JOIN_TIMEOUT:g}s of kubeadm join:\n{status}")
    # STAND-IN for the node lifecycle controller: the Node is Ready, so it may take Pods (module docstring)
    kube.kubectl("taint", "node", name, f"{NOT_READY_TAINT}-")
