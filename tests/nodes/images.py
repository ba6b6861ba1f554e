"""Images on the node lab's real nodes, without a registry: built here with podman, imported into each
node's containerd (namespace ``k8s.io``, the one the kubelet's CRI uses), run with
``imagePullPolicy: Never``.

Three kinds of image:

- the **stand-in pause image** (:data:`hostlab.node_base.PAUSE_IMAGE`, containerd's ``sandbox_image`` on
  the nodes): not Kubernetes' pause binary but busybox-static from the nodes' own root filesystem, whose
  entrypoint (busybox's ``sh``) ends in ``exec /bin/busybox sleep 2147483647``: it does what a sandbox's
  first process must (hold the Pod's namespaces, do nothing). busybox picks its applet from ``argv[0]``,
  hence the explicit applet names after it. With the one argument ``-v`` it prints a line and exits 0,
  as Kubernetes' pause does (kubeadm's upgrade health check runs a Job of the pause image so).
  Imported into every node when the node lab starts (tests/nodes/conftest.py);
- **the project's own image** (:func:`node_image`): the Dockerfile built exactly as the image tests build
  it (:func:`deploy.image.service_image`, one build per content for both), imported into every node of a
  cluster the first time a test asks for it;
- **the control plane kubeadm runs as static Pods** (:func:`import_control_plane`): kube-apiserver,
  kube-controller-manager and kube-scheduler at each version asked, and etcd, each an image ``FROM
  scratch`` holding the one static binary kubelab built from the pinned Go modules
  (:data:`kubelab.build.CONTROL_PLANE_BINARIES`) in ``/usr/local/bin``, where kubeadm's static Pod
  manifests run it from (``command: [kube-apiserver, ...]``). They are named as kubeadm expects them under
  the lab's ``imageRepository`` :data:`CONTROL_PLANE_REPOSITORY` (``lab.local/kube-apiserver:v1.36.1``;
  etcd's tag is kubelab's etcd version, which the ClusterConfiguration names in ``etcd.local.imageTag``),
  and the stand-in pause image is tagged ``lab.local/pause:<kubeadm's pause version>`` as well, since
  kubeadm's preflight checks for that image (the nodes' containerd runs its sandbox image,
  :data:`hostlab.node_base.PAUSE_IMAGE`: the same image).

Each image is saved once per content (``podman save -m --format docker-archive``, cached beside the
suite's podman storage under the image lock), copied into the node's root filesystem (not its ``/tmp``,
a tmpfs of the booted node that the host's copy would not reach) and imported with ``ctr -n k8s.io
images import``; the copy is removed afterwards. containerd keeps the image twice on the node's disk
(its tmpfs, so in memory): the layers as imported and unpacked, about 820 MB per node for the project's
image of 415 MB (measured), hence imported only when a test asks for it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.image import CACHE_DIR, EngineError, Podman, service_image
from hostlab.config import Config
from hostlab.errors import LabError
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.node_base import PAUSE_IMAGE, node_base_dir
from hostlab.proc import file_lock
from kubelab import build

if TYPE_CHECKING:
    from .conftest import Cluster

ARCHIVES = CACHE_DIR / "archives"
LOCK = CACHE_DIR / "node-images.lock"
PAUSE_REPOSITORY = PAUSE_IMAGE.rsplit(":", 1)[0]
# `-v`: what kubeadm's upgrade health check runs (a Job of the pause image with args ["-v"], which must
# complete); anything else sleeps, the sandbox
PAUSE_SCRIPT = '[ "${1:-}" = -v ] && { echo stand-in-pause; exit 0; }; exec /bin/busybox sleep 2147483647'
PAUSE_CONTAINERFILE = (
    "FROM scratch\nCOPY busybox /bin/busybox\n"
    f'ENTRYPOINT ["/bin/busybox", "sh", "-c", {json.dumps(PAUSE_SCRIPT)}, "stand-in-pause"]\n'
)
# kubeadm's imageRepository on the lab's nodes: a name no registry answers to, the images are imported
CONTROL_PLANE_REPOSITORY = "lab.local"
KUBEADM_PAUSE_TAG = "3.10.2"  # kubeadm v1.36's constants.PauseVersion: the pause image its preflight checks
# one static binary (CGO_ENABLED=0, kubelab.build) where kubeadm's static Pods run it from, by name
BINARY_CONTAINERFILE = "FROM scratch\nCOPY {name} /usr/local/bin/{name}\nENV PATH=/usr/local/bin\n"
IN_NODE_DIR = "var/lib/hostlab-images"  # in the node's root filesystem (its disk), never its /tmp
IMPORT_TIMEOUT = 300.0
LOCK_TIMEOUT = 1800.0  # the service image's build may hold it (about 2 minutes, longer on busy cores)
ARCHIVE_MAX_AGE = 86400.0  # seconds; older archives (other content, earlier runs) are removed


def _image_id(podman: Podman, ref: str) -> str:
    return podman.run("image", "inspect", "--format", "{{.Id}}", ref).strip()


def _archive(podman: Podman, ref: str) -> Path:
    """The docker-archive of ``ref`` (call under :data:`LOCK`)."""
    return _archive_of(podman, [ref])


def _archive_of(podman: Podman, refs: Sequence[str]) -> Path:
    """The docker-archive of all ``refs`` (one import per node), saved once per names and image IDs
    (call under :data:`LOCK`)."""
    ids = "\n".join(f"{ref}\n{_image_id(podman, ref)}" for ref in refs)
    path = ARCHIVES / f"{hashlib.sha256(ids.encode()).hexdigest()[:16]}.tar"
    if not path.is_file():
        ARCHIVES.mkdir(parents=True, exist_ok=True)
        for old in ARCHIVES.glob("*.tar"):
            if time.time() - old.stat().st_mtime > ARCHIVE_MAX_AGE:
                old.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=ARCHIVES, prefix="save-") as tmp:
            partial = Path(tmp) / path.name
            # -m: each name keeps its own image (without it every name lands on the first image)
            podman.run("save", "-m", "--format", "docker-archive", "-o", str(partial), *refs, timeout=900)
            partial.rename(path)
    return path


def pause_archive(podman: Podman) -> Path:
    """The stand-in pause image, named :data:`PAUSE_IMAGE`, as a docker-archive (built once per busybox)."""
    busybox = node_base_dir(Config.from_env()) / "bin/busybox"
    if not busybox.is_file():
        raise LabError(f"no {busybox}: the nodes' root filesystem has no busybox-static")
    content = hashlib.sha256(busybox.read_bytes() + PAUSE_CONTAINERFILE.encode()).hexdigest()[:12]
    built = f"{PAUSE_REPOSITORY}:{content}"
    with file_lock(LOCK, timeout=LOCK_TIMEOUT, what="node image lock"):
        if not podman.image_exists(built):
            CACHE_DIR.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="pause-") as tmp:
                context = Path(tmp)
                shutil.copy2(busybox, context / "busybox")
                (context / "Containerfile").write_text(PAUSE_CONTAINERFILE)
                argv = ["build", "--format=docker", f"--tag={built}", "-f", str(context / "Containerfile")]
                podman.run(*argv, str(context), timeout=300)
        podman.run("tag", built, PAUSE_IMAGE)  # the name containerd's sandbox_image says
        return _archive(podman, PAUSE_IMAGE)


def binary_image(podman: Podman, name: str, binary: Path, ref: str) -> None:
    """``ref``: an image ``FROM scratch`` holding only ``binary`` as ``/usr/local/bin/<name>``, built once
    per content (the binary's bytes and the Containerfile) and tagged ``ref`` (call under :data:`LOCK`)."""
    containerfile = BINARY_CONTAINERFILE.format(name=name)
    digest = hashlib.sha256(containerfile.encode())
    with binary.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    built = f"localhost/hostlab/{name}:{digest.hexdigest()[:12]}"
    if not podman.image_exists(built):
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix=f"{name}-") as tmp:
            context = Path(tmp)
            shutil.copyfile(binary, context / name)
            (context / name).chmod(0o755)
            (context / "Containerfile").write_text(containerfile)
            argv = ["build", "--format=docker", f"--tag={built}", "-f", str(context / "Containerfile")]
            podman.run(*argv, str(context), timeout=600)
    podman.run("tag", built, ref)


def control_plane_archive(podman: Podman, binaries: Mapping[str, tuple[str, Path]]) -> Path:
    """The control-plane images (``ref -> (binary name, binary)``) and the stand-in pause image under
    kubeadm's pause name, built where missing, as one docker-archive."""
    pause = f"{CONTROL_PLANE_REPOSITORY}/pause:{KUBEADM_PAUSE_TAG}"
    pause_archive(podman)  # builds and tags PAUSE_IMAGE
    with file_lock(LOCK, timeout=LOCK_TIMEOUT, what="node image lock"):
        for ref, (name, binary) in binaries.items():
            binary_image(podman, name, binary, ref)
        podman.run("tag", PAUSE_IMAGE, pause)
        return _archive_of(podman, [*binaries, pause])


def control_plane_images(
    binaries: Mapping[str, Path], versions: Sequence[str] = (build.NODE_VERSIONS[0], build.NODE_VERSIONS[-1])
) -> dict[str, tuple[str, Path]]:
    """ref -> (binary name in the image, built binary) for the control plane at each of ``versions`` and
    etcd, from ``binaries`` (the built :data:`kubelab.build.CONTROL_PLANE_BINARIES`, by name)."""
    images = {f"{CONTROL_PLANE_REPOSITORY}/etcd:{build.ETCD_VERSION}": ("etcd", binaries["etcd"])}
    for version in versions:
        for component in build.CONTROL_PLANE:
            built = binaries[build.control_plane_binary(component, version)]
            images[f"{CONTROL_PLANE_REPOSITORY}/{component}:{version}"] = (component, built)
    return images


def import_control_plane(
    lab: HostLab, hosts: Sequence[Host], binaries: Mapping[str, tuple[str, Path]]
) -> None:
    """The control-plane images of ``binaries`` (see :func:`control_plane_archive`) into every node of
    ``hosts``, checked there by name."""
    try:
        archive = control_plane_archive(Podman(), binaries)
    except EngineError as exc:
        raise LabError(f"the control-plane images for the nodes: {exc}") from exc

    def one(host: Host) -> None:
        import_archive(lab, host, archive)
        missing = [ref for ref in binaries if not node_has_image(lab, host, ref)]
        if missing:
            raise LabError(f"{host.name}: {', '.join(missing)} not in containerd after the import")

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        for done in [pool.submit(one, host) for host in hosts]:
            done.result()


def node_has_image(lab: HostLab, host: Host, ref: str) -> bool:
    listed = lab.exec_in(host, ["ctr", "-n", "k8s.io", "images", "ls", "-q", f"name=={ref}"])
    return listed.returncode == 0 and ref in listed.stdout.split()


def import_archive(lab: HostLab, host: Host, archive: Path) -> None:
    """``ctr -n k8s.io images import`` of ``archive`` inside node ``host`` (copied onto its disk first)."""
    in_node = host.root() / IN_NODE_DIR
    in_node.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, in_node / archive.name)
    try:
        argv = ["ctr", "-n", "k8s.io", "images", "import", f"/{IN_NODE_DIR}/{archive.name}"]
        result = lab.exec_in(host, argv, timeout=IMPORT_TIMEOUT)
    finally:
        (in_node / archive.name).unlink(missing_ok=True)
    if result.returncode != 0:
        raise LabError(f"{host.name}: ctr images import failed: {(result.stderr or result.stdout).strip()}")


def import_pause(lab: HostLab, hosts: list[Host]) -> None:
    """The stand-in pause image into every node of ``hosts`` (before any Pod is bound to them)."""
    try:
        archive = pause_archive(Podman())
    except EngineError as exc:
        raise LabError(f"building the stand-in pause image failed: {exc}") from exc
    for host in hosts:
        import_archive(lab, host, archive)
        if not node_has_image(lab, host, PAUSE_IMAGE):
            raise LabError(f"{host.name}: {PAUSE_IMAGE} not in containerd after the import")


def node_image(cluster: Cluster) -> str:
    """The project's image, imported into every node of ``cluster`` (once: a node that has it is
    skipped); returns its reference for a Pod's ``image`` (with ``imagePullPolicy: Never``)."""
    return import_service_image(cluster.lab, cluster.hosts)


def import_service_image(lab: HostLab, hosts: list[Host]) -> str:
    """The project's image, imported into each node of ``hosts`` in ``lab`` that does not have it yet;
    returns its reference."""
    podman = Podman()
    try:
        ref = service_image(podman)
        missing = [h for h in hosts if not node_has_image(lab, h, ref)]
        if not missing:
            return ref
        with file_lock(LOCK, timeout=LOCK_TIMEOUT, what="node image lock"):
            archive = _archive(podman, ref)
    except EngineError as exc:
        raise LabError(f"the project's image for the nodes: {exc}") from exc

    def one(host: Host) -> None:
        import_archive(lab, host, archive)
        if not node_has_image(lab, host, ref):
            raise LabError(f"{host.name}: {ref} not in containerd after the import")

    # the nodes unpack at once (about 15 s each alone): each waits mostly on its own tmpfs writes
    with ThreadPoolExecutor(max_workers=len(missing)) as pool:
        for done in [pool.submit(one, host) for host in missing]:
            done.result()
    return ref
