"""A workload cluster that the real CAPI controllers build on the lab provider's real nodes (issue #27 item
3): the pool's preparation, the objects a user writes (Cluster, LabCluster, KubeadmControlPlane,
MachineDeployment and their templates), and the workload cluster's API as CAPI's kubeconfig Secret names it.

What a node of the pool holds before any Machine takes it, as a machine image for a bare-metal pool would
(the **pool preparation** does it, not the provider, which carries out only CABPK's bootstrap data):

- every image kubeadm runs, imported into its containerd (no registry: :mod:`nodes.images`): the
  control plane at both node versions and etcd under ``imageRepository`` ``lab.local``, and the stand-in
  pause image (the nodes' sandbox image, also as kubeadm's ``lab.local/pause``);
- kubelet and kubeadm at the **image version** (the workers' starting version) in ``/usr/bin``, as a
  machine image built for one Kubernetes version carries them (and kubectl: the stand-in below), and at
  each version the cluster uses side by side in :data:`STAGED` (``/opt/lab-kubernetes/<version>/``: the
  machine images a LabMachineTemplate may name, :func:`lab_machine_template`, which the provider installs
  before the bootstrap), with the Kubernetes packages' kubelet units (not enabled).

Everything else is in the KubeadmConfigSpecs, as a user would write it: the control plane's
``preKubeadmCommands`` install its version of kubelet and kubeadm from :data:`STAGED`; the workers' use
the image's and name no version, so that a MachineDeployment's ``version`` can change in place without
a change of its bootstrap commands (which only run at bootstrap, and which the service leaves to a
rollout); both enable the kubelet; the
``imageRepository``, etcd's image tag and ``skipPhases`` (CoreDNS, kube-proxy: the lab builds no image of
either); the preflight checks a node of this lab cannot pass
(:data:`nodes.kubeadm_cluster.IGNORED_PREFLIGHT`);
and the lab nodes' KubeletConfiguration (cgroup v1, cgroupfs, no QoS cgroups) as a kubeadm patch
(``kubeletconfiguration+merge.json`` in :data:`PATCHES_DIR`, written by ``files``), because CABPK has no
field for a KubeletConfiguration. The control plane's advertise address is the first node's, which is
also the LabCluster's ``controlPlaneEndpoint``: the provider hands out the pool's nodes in order and the
control-plane Machine is the first with bootstrap data (CABPK writes the workers' only once the control
plane is initialized), so it lands there (the test checks it).

For the workers' in-place update (:func:`in_place_worker_spec`, ``test_capi_workload.py``) the service runs
the kubernetes_version role with the binaries of a release server on the pool's gateway
(:func:`release_binary`: the lab's own builds in dl.k8s.io's layout) and the role settings of
:func:`capabilities`: ``kubeadm upgrade node`` with the same :data:`PATCHES_DIR` (else it would write the
kubelet's configuration from the cluster's ConfigMap alone, without the lab nodes' fields) and the
preflight check a cgroup v1 node cannot pass. **Stand-in, named:** kubectl, which the role installs beside
kubelet, is kubelab's own build (:data:`kubelab.build.KUBERNETES_VERSION`) served under every node
version and in the pool's ``/usr/bin``: the lab builds kubectl at that version only; nothing on a worker
runs it, and on a control-plane node the role runs it once, to read the ``kubeadm-config`` ConfigMap.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hostlab.errors import LabError
from hostlab.inventory import service_inventory
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import build, node_join, objects
from kubelab.flavours import capi_objects as co
from kubelab.flavours.nodes import CONTAINERD_SOCKET, KUBELET_CONFIGURATION
from kubelab.lab import Lab as KubeLab
from kubelab.labprovider import crds, node_program
from nodes.images import CONTROL_PLANE_REPOSITORY, control_plane_images, import_control_plane, import_pause
from nodes.kubeadm_cluster import API_PORT, IGNORED_PREFLIGHT, AdminApi

from .kube_aware import KubeExtension, run_attempts

# <version>/kubelet and <version>/kubeadm on every pool node: the machine images a LabMachine may name
STAGED = str(node_program.IMAGES)
PATCHES_DIR = "/etc/kubernetes/lab-patches"  # kubeadm's --patches directory, written by the KubeadmConfig
# the lab nodes' KubeletConfiguration fields, as a JSON merge patch kubeadm applies to the kubelet's config
KUBELET_PATCH = {k: v for k, v in KUBELET_CONFIGURATION.items() if k not in ("apiVersion", "kind")}
# CAPI's MachineSet preflight check: kubeadm joins only at the control plane's minor. The workers here are
# one minor behind (v1.35.4 under v1.36.1, the start of issue #27's minor upgrade), which kubeadm v1.35
# does join; a user running that skew says so on the MachineDeployment, as here.
SKIP_PREFLIGHT = {"machineset.cluster.x-k8s.io/skip-preflight-checks": "KubeadmVersionSkew"}
KUBECONFIG_SECRET = "{cluster}-kubeconfig"  # CAPI's: data.value, the admin kubeconfig KCP writes
# the Machine annotation whose RFC 3339 timestamp asks the shipped kubelet_credentials capability for a
# rotation (named in :func:`capabilities`); users set it in the MachineDeployment's template metadata
ROTATION_ANNOTATION = "lab.inplace-extension.dev/rotate-kubelet-credentials"
# kubeadm init's addon phases skipped (the lab builds no CoreDNS or kube-proxy image) by a line added to
# the InitConfiguration in CABPK's init file, not by initConfiguration.skipPhases: KCP v1.14.2 compares
# the first control-plane Machine's InitConfiguration as a JoinConfiguration (PrepareKubeadmConfigsForDiff
# in controlplane/kubeadm/pkg/filters.go), kubeadm join refuses addon phases ("invalid phase name"), so
# with skipPhases in init only that Machine differs from the desired one in a field no extension claims,
# and KCP replaces it instead of updating it in place. On a joining node the file does not exist.
INIT_FILE = "/run/kubeadm/kubeadm.yaml"  # CABPK's kubeadm init --config file
SKIP_ADDONS = (
    f"[ ! -f {INIT_FILE} ] || sed -i "
    f"'s|^kind: InitConfiguration$|&\\nskipPhases: [addon/coredns, addon/kube-proxy]|' {INIT_FILE}"
)
# kubeadm upgrade's preflight checks skipped: the lab nodes' (cgroup v1) and, on a control-plane node,
# ImagePull: `upgrade node` pulls every image of the cluster's kubeadm-config, CoreDNS and kube-proxy
# included (the skipped addon phases are not recorded there), and the lab builds neither; the control
# plane's own images are in containerd already
UPGRADE_IGNORED_PREFLIGHT = (*IGNORED_PREFLIGHT, "ImagePull")
KUBEADM_UPGRADE_TASK = "Upgrade the node with kubeadm"  # the kubernetes_version role's (upgrade.yml)


def node_binaries(versions: tuple[str, ...]) -> tuple[str, ...]:
    """The kubelab binaries a pool needs: the control plane's, kubelet and kubeadm at ``versions``, and
    kubectl."""
    staged = (f"{name}-{version}" for version in versions for name in ("kubelet", "kubeadm"))
    return tuple(dict.fromkeys((*build.CONTROL_PLANE_BINARIES, *staged, "kubectl")))


def prepare_pool(pool: HostLab, binaries: Mapping[str, Path], versions: tuple[str, ...], image: str) -> None:
    """Every node of ``pool`` as the module's docstring says: the images in its containerd, kubelet and
    kubeadm at ``image`` installed and at each of ``versions`` staged, the kubelet's units installed."""
    hosts = pool.hosts()
    import_pause(pool, hosts)
    import_control_plane(pool, hosts, control_plane_images(binaries))
    for host in hosts:
        _stage(pool, host, binaries, versions, image)


def _stage(
    pool: HostLab, host: Host, binaries: Mapping[str, Path], versions: tuple[str, ...], image: str
) -> None:
    root = host.root()
    # kubectl beside them, as the Kubernetes packages install it: the kubernetes_version role reads the
    # cluster's version with it on a control-plane node before it upgrades anything
    for name, binary in (
        ("kubelet", f"kubelet-{image}"),
        ("kubeadm", f"kubeadm-{image}"),
        ("kubectl", "kubectl"),
    ):
        (root / "usr/bin" / name).write_bytes(binaries[binary].read_bytes())
        (root / "usr/bin" / name).chmod(0o755)
    for version in versions:
        target = root / STAGED.lstrip("/") / version
        target.mkdir(parents=True, exist_ok=True)
        for name in ("kubelet", "kubeadm"):
            (target / name).write_bytes(binaries[f"{name}-{version}"].read_bytes())
            (target / name).chmod(0o755)
    (root / "lib/systemd/system/kubelet.service").write_text(node_join.KUBELET_SERVICE)
    dropin = root / "etc/systemd/system/kubelet.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "10-kubeadm.conf").write_text(node_join.KUBEADM_DROPIN)
    result = pool.exec_in(host, ["systemctl", "daemon-reload"])
    if result.returncode != 0:
        raise LabError(f"{host.name}: systemctl daemon-reload failed: {result.stderr.strip()}")


def _node_registration() -> dict[str, Any]:
    """The node named as the provider names it (CABPK's jinja metadata), its providerID for CAPI's
    Machine controller to find the Node by, containerd, the preflight checks a lab node cannot pass."""
    return {
        "name": "{{ ds.meta_data.local_hostname }}",
        "criSocket": CONTAINERD_SOCKET,
        "kubeletExtraArgs": [{"name": "provider-id", "value": "lab://{{ ds.meta_data.local_hostname }}"}],
        "ignorePreflightErrors": list(IGNORED_PREFLIGHT),
    }


def _common(*install: str) -> dict[str, Any]:
    return {
        "format": "cloud-config",
        "files": [
            {
                "path": f"{PATCHES_DIR}/kubeletconfiguration+merge.json",
                "content": json.dumps(KUBELET_PATCH),
                "permissions": "0644",
            }
        ],
        "preKubeadmCommands": [*install, "systemctl enable kubelet"],
    }


def control_plane_spec(version: str) -> dict[str, Any]:
    """The KubeadmControlPlane's kubeadmConfigSpec (see the module's docstring). ``kubeadm init`` and
    ``join --control-plane`` are written alike (the node's name, address, patches, no skipPhases), because
    KCP compares the first Machine's InitConfiguration as a JoinConfiguration before an update in place
    (:data:`SKIP_ADDONS`)."""
    spec = _common(
        f"install -m 0755 {STAGED}/{version}/kubelet {STAGED}/{version}/kubeadm /usr/bin/", SKIP_ADDONS
    )
    patches = {"directory": PATCHES_DIR}
    spec["clusterConfiguration"] = {
        "imageRepository": CONTROL_PLANE_REPOSITORY,
        "etcd": {"local": {"imageTag": build.ETCD_VERSION}},
    }
    # each control plane advertises its node's address (the provider's metadata): the lab's nodes have no
    # default route for kubeadm to find one by
    local = {"advertiseAddress": "{{ ds.meta_data.local_ipv4 }}", "bindPort": API_PORT}
    spec["initConfiguration"] = {
        "localAPIEndpoint": local,
        "nodeRegistration": _node_registration(),
        "patches": patches,
    }
    spec["joinConfiguration"] = {
        "nodeRegistration": _node_registration(),
        "controlPlane": {"localAPIEndpoint": local},
        "patches": patches,
    }
    return spec


def worker_spec() -> dict[str, Any]:
    """The workers' KubeadmConfigTemplate spec: the image's kubelet and kubeadm, whatever the version."""
    spec = _common()
    patches = {"directory": PATCHES_DIR}
    spec["joinConfiguration"] = {"nodeRegistration": _node_registration(), "patches": patches}
    return spec


def in_place_worker_spec(
    flag: tuple[str, str], file: Mapping[str, str], user: Mapping[str, Any], ntp: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`worker_spec` with what the in-place update adds: a kubelet flag, a file, a user, NTP (each a
    change the service claims; the lab provider refuses ``users`` and ``ntp`` at creation only)."""
    spec = worker_spec()
    spec["files"].append(dict(file))
    registration = spec["joinConfiguration"]["nodeRegistration"]
    registration["kubeletExtraArgs"].append({"name": flag[0], "value": flag[1]})
    spec["users"] = [dict(user)]
    spec["ntp"] = dict(ntp)
    return spec


def release_binary(binaries: Mapping[str, Path]) -> Callable[[str, str], bytes | None]:
    """What the pool's release server serves (module docstring): ``binaries``' kubelet and kubeadm at
    their versions, and kubelab's kubectl (the stand-in) at any version kubelet has."""

    def serve(name: str, version: str) -> bytes | None:
        wanted = "kubectl" if name == "kubectl" and f"kubelet-{version}" in binaries else f"{name}-{version}"
        return binaries[wanted].read_bytes() if wanted in binaries else None

    return serve


def capabilities(release_url: str) -> str:
    """The service's capabilities file (module docstring): the kubernetes_version role's settings and the
    shipped kubelet_credentials capability, asked for by :data:`ROTATION_ANNOTATION` (its default paths
    are kubeadm's)."""
    ignored = ",".join(UPGRADE_IGNORED_PREFLIGHT)
    upgrade_args = [f"--ignore-preflight-errors={ignored}", f"--patches={PATCHES_DIR}"]
    return (
        "role_settings:\n"
        "  kubernetes_version:\n"
        "    package_source: binary\n"
        f"    binary_base_url: {release_url}\n"
        f"    kubeadm_upgrade_args: {json.dumps(upgrade_args)}\n"
        "    health_delay_seconds: 1\n"
        "kubelet_credentials:\n"
        f"  annotation: {ROTATION_ANNOTATION}\n"
    )


def machine_inventory(pool: HostLab, machines: Mapping[str, Host]) -> dict[str, Any]:
    """The service's inventory: each Machine (by name) on its pool node, with that node's address and
    its own pinned host key (hostlab's entries, renamed from the node's name to the Machine's)."""
    entries = {e["match"]["name"]: e for e in service_inventory(pool)["hosts"]}
    return {"hosts": [{**entries[host.name], "match": {"name": name}} for name, host in machines.items()]}


def cluster_objects(
    name: str,
    namespace: str,
    endpoint: Host,
    control_plane: tuple[int, str],
    workers: tuple[int, str],
) -> list[dict[str, Any]]:
    """The Cluster on a LabCluster whose endpoint is ``endpoint``'s address, a KubeadmControlPlane of
    ``control_plane`` (replicas, version) and a MachineDeployment of ``workers`` (replicas, version), with
    their LabMachineTemplates and the workers' KubeadmConfigTemplate. The KubeadmControlPlane rolls out
    with ``maxSurge: 0`` (CAPI's webhook allows it from 3 replicas): KCP then takes each Machine down
    instead of first creating one, which is where CAPI v1.14 tries an update in place."""
    (control_planes, control_plane_version), (replicas, worker_version) = control_plane, workers
    cluster = co.cluster(name, namespace, control_plane=f"{name}-cp")
    cluster["spec"]["infrastructureRef"] = co.ref(crds.GROUP, "LabCluster", name)
    # the nodes' bridge CNI gives each node 10.244.0.0/24 (hostlab's node recipe); no Service is proxied
    cluster["spec"]["clusterNetwork"]["pods"] = {"cidrBlocks": ["10.244.0.0/16"]}
    cluster["spec"]["clusterNetwork"]["services"] = {"cidrBlocks": ["10.96.0.0/12"]}
    lab_cluster = {
        "apiVersion": crds.API_VERSION,
        "kind": "LabCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"controlPlaneEndpoint": {"host": endpoint.address, "port": API_PORT}},
    }
    templates = [lab_machine_template(template, namespace) for template in (f"{name}-cp", f"{name}-md")]
    kcp = co.kubeadm_control_plane(
        f"{name}-cp",
        namespace,
        control_planes,
        control_plane_version,
        f"{name}-cp",
        control_plane_spec(control_plane_version),
        max_surge=0,
    )
    kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"] = co.ref(
        crds.GROUP, "LabMachineTemplate", f"{name}-cp"
    )
    bootstrap = co.kubeadm_config_template(f"{name}-md", namespace, worker_spec())
    deployment = co.machine_deployment(
        f"{name}-md", namespace, name, replicas, worker_version, f"{name}-md", f"{name}-md"
    )
    deployment["metadata"]["annotations"] = dict(SKIP_PREFLIGHT)
    deployment["spec"]["template"]["spec"]["infrastructureRef"] = co.ref(
        crds.GROUP, "LabMachineTemplate", f"{name}-md"
    )
    return [lab_cluster, cluster, *templates, kcp, bootstrap, deployment]


def lab_machine_template(name: str, namespace: str, image: str | None = None) -> dict[str, Any]:
    """A LabMachineTemplate: its Machines on the pool nodes as they are, or over the machine image of the
    Kubernetes version ``image`` (the lab provider installs that version's kubelet and kubeadm)."""
    spec = {"image": image} if image else {}
    return {
        "apiVersion": crds.API_VERSION,
        "kind": "LabMachineTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": spec}},
    }


def kubeadm_upgrades(ext: KubeExtension, machine: str) -> list[list[str]]:
    """The ``kubeadm upgrade`` command lines the kubernetes_version role ran to success for ``machine``
    (``<namespace>/<name>``), from the service's run records (each attempt's ansible-runner events of its
    host), in order."""
    ran: list[list[str]] = []
    for meta in run_attempts(ext, machine):
        events = Path(meta["batch_dir"]) / "artifacts" / meta["batch_ident"] / "job_events"
        found = []
        for path in events.glob("*.json"):
            event = json.loads(path.read_text())
            data = event.get("event_data") or {}
            if (
                event.get("event") == "runner_on_ok"
                and data.get("host") == meta["host"]
                and data.get("task") == KUBEADM_UPGRADE_TASK
            ):
                found.append((int(event["counter"]), [str(arg) for arg in data["res"]["cmd"]]))
        ran.extend(argv for _, argv in sorted(found, key=lambda item: item[0]))
    return ran


def kubeconfig(kube: KubeLab, cluster: str, namespace: str) -> str | None:
    """The workload cluster's admin kubeconfig from the Secret CAPI writes, or None while there is none."""
    secret = objects.get(kube, "secret", KUBECONFIG_SECRET.format(cluster=cluster), namespace)
    if secret is None or "value" not in secret.get("data", {}):
        return None
    return base64.b64decode(secret["data"]["value"]).decode()


@contextmanager
def workload_api(text: str) -> Iterator[AdminApi]:
    """The workload cluster's API through the kubeconfig ``text`` (its server, CA and client cert)."""
    api = AdminApi.from_admin_conf(text)
    try:
        yield api
    finally:
        api.close()
