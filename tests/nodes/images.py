"""Images on the node lab's real nodes, without a registry: built here with podman, imported into each
node's containerd (namespace ``k8s.io``, the one the kubelet's CRI uses), run with
``imagePullPolicy: Never``.

Two images:

- the **stand-in pause image** (:data:`hostlab.node_base.PAUSE_IMAGE`, containerd's ``sandbox_image`` on
  the nodes): not Kubernetes' pause binary but busybox-static from the nodes' own root filesystem, whose
  entrypoint ``/bin/busybox sleep 2147483647`` does what a sandbox's first process must (hold the Pod's
  namespaces, do nothing). busybox picks its applet from ``argv[0]``, hence the explicit ``sleep``
  after it. Imported into every node when the node lab starts (tests/nodes/conftest.py);
- **the project's own image** (:func:`node_image`): the Dockerfile built exactly as the image tests build
  it (:func:`deploy.image.service_image`, one build per content for both), imported into every node of a
  cluster the first time a test asks for it.

Each image is saved once per content (``podman save -m --format docker-archive``, cached beside the
suite's podman storage under the image lock), copied into the node's root filesystem (not its ``/tmp``,
a tmpfs of the booted node that the host's copy would not reach) and imported with ``ctr -n k8s.io
images import``; the copy is removed afterwards. containerd keeps the image twice on the node's disk
(its tmpfs, so in memory): the layers as imported and unpacked, about 820 MB per node for the project's
image of 415 MB (measured), hence imported only when a test asks for it.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
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

if TYPE_CHECKING:
    from .conftest import Cluster

ARCHIVES = CACHE_DIR / "archives"
LOCK = CACHE_DIR / "node-images.lock"
PAUSE_REPOSITORY = PAUSE_IMAGE.rsplit(":", 1)[0]
PAUSE_CONTAINERFILE = (
    'FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT ["/bin/busybox", "sleep", "2147483647"]\n'
)
IN_NODE_DIR = "var/lib/hostlab-images"  # in the node's root filesystem (its disk), never its /tmp
IMPORT_TIMEOUT = 300.0
LOCK_TIMEOUT = 1800.0  # the service image's build may hold it (about 2 minutes, longer on busy cores)
ARCHIVE_MAX_AGE = 86400.0  # seconds; older archives (other content, earlier runs) are removed


def _image_id(podman: Podman, ref: str) -> str:
    return podman.run("image", "inspect", "--format", "{{.Id}}", ref).strip()


def _archive(podman: Podman, ref: str) -> Path:
    """The docker-archive of ``ref``, saved once per name and image ID (call under :data:`LOCK`)."""
    key = hashlib.sha256(f"{ref}\n{_image_id(podman, ref)}".encode()).hexdigest()[:16]
    path = ARCHIVES / f"{key}.tar"
    if not path.is_file():
        ARCHIVES.mkdir(parents=True, exist_ok=True)
        for old in ARCHIVES.glob("*.tar"):
            if time.time() - old.stat().st_mtime > ARCHIVE_MAX_AGE:
                old.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=ARCHIVES, prefix="save-") as tmp:
            partial = Path(tmp) / path.name
            # -m: each name keeps its own image (without it every name lands on the first image)
            podman.run("save", "-m", "--format", "docker-archive", "-o", str(partial), ref, timeout=600)
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
    podman = Podman()
    try:
        ref = service_image(podman)
        missing = [h for h in cluster.hosts if not node_has_image(cluster.lab, h, ref)]
        if not missing:
            return ref
        with file_lock(LOCK, timeout=LOCK_TIMEOUT, what="node image lock"):
            archive = _archive(podman, ref)
    except EngineError as exc:
        raise LabError(f"the project's image for the nodes: {exc}") from exc

    def one(host: Host) -> None:
        import_archive(cluster.lab, host, archive)
        if not node_has_image(cluster.lab, host, ref):
            raise LabError(f"{host.name}: {ref} not in containerd after the import")

    # the nodes unpack at once (about 15 s each alone): each waits mostly on its own tmpfs writes
    with ThreadPoolExecutor(max_workers=len(missing)) as pool:
        for done in [pool.submit(one, host) for host in missing]:
            done.result()
    return ref
