"""The container engine of the image tests: Debian's podman with runc, and a Debian base image made here.

Public base images cannot be pulled on the machines the suite runs on, so the Dockerfile's
``BASE_IMAGE`` is replaced by one built from Debian packages: ``mmdebstrap`` makes a bookworm root
filesystem with the Python the Dockerfile expects (``python3``, ``python3-venv``,
``python-is-python3``, ``passwd``), ``podman import`` turns it into an image. It is built once per
machine and recipe (the tag carries the recipe's hash; a file lock keeps two sessions from building it
twice) and kept in the suite's own podman storage, beside the other lab caches.

The base image also trusts the CA certificates this machine trusts (``/usr/local/share/ca-certificates``)
and points pip at the system bundle: where outbound TLS is inspected by a proxy, the image build's
``pip install`` and ``apt-get`` reach their servers only that way. A user building with the default
base image needs none of this.

Podman runs with the settings this machine kind needs: ``runc`` (crun, podman's default, refuses hybrid
cgroups), the cgroupfs manager and file events (no systemd). Everything a test creates is removed by ID.

The project's image itself (:func:`service_image`) is built from the Dockerfile once per content: its
tag carries a hash of everything the build reads (the Dockerfile, the build context it copies, the base
image), a file lock keeps two sessions or pytest workers from building it twice, and the image tests
and the node tests (tests/nodes/images.py, which imports it into the real nodes) use the same image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostlab.config import machine_mirror
from hostlab.proc import file_lock

CACHE_DIR = Path(os.environ.get("INPLACE_IMAGE_CACHE_DIR", "/var/cache/inplace-extension/image"))
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd", "ca-certificates")
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
PIP_CONF = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
TOOLS = ("podman", "runc", "mmdebstrap")
BASE_BUILD_TIMEOUT = 900.0
ROOT = Path(__file__).resolve().parents[2]
# what `docker build .` reads: the Dockerfile and what .dockerignore lets into the context (the
# Dockerfile copies exactly these); caches and bytecode never change the image
BUILD_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")
BUILD_TREES = ("inplace_extension", "playbooks", "schemas")
SERVICE_REPOSITORY = "localhost/inplace-extension-test"
SERVICE_BUILD_TIMEOUT = 1200.0
KEEP_SERVICE_IMAGES = 3  # older builds (of other checkouts' content) are removed, unless younger than:
KEEP_YOUNGER_THAN = 3600.0  # seconds: another session may be about to use its own


class EngineError(Exception):
    """A podman or mmdebstrap command failed; the message carries its output."""


def missing_tools() -> str | None:
    """Why the image tests cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "building and running the image needs root (podman with runc, mmdebstrap)"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"missing {', '.join(absent)} (scripts/bootstrap installs them as root)"
    return None


@dataclass(frozen=True)
class Podman:
    """podman on the suite's own storage (``<cache>/storage``), so the machine's images are not touched."""

    root: Path = CACHE_DIR / "storage"
    runroot: Path = Path("/run/inplace-extension/podman")

    def argv(self, *args: str) -> list[str]:
        storage = [f"--root={self.root}", f"--runroot={self.runroot}"]
        engine = ["--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime=runc"]
        return ["podman", *storage, *engine, *args]

    def run(self, *args: str, timeout: float = 120, input_bytes: bytes | None = None) -> str:
        try:
            proc = subprocess.run(
                self.argv(*args), input=input_bytes, capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"podman {' '.join(args)} timed out after {timeout:g}s") from exc
        if proc.returncode != 0:
            raise EngineError(
                f"podman {' '.join(args)} failed (exit {proc.returncode}):\n"
                + (proc.stderr or proc.stdout).decode(errors="replace")[-4000:]
            )
        return proc.stdout.decode()

    def image_exists(self, ref: str) -> bool:
        return (
            subprocess.run(self.argv("image", "exists", ref), capture_output=True, check=False).returncode
            == 0
        )


def _local_cas() -> list[Path]:
    return sorted(LOCAL_CAS.glob("*.crt")) if LOCAL_CAS.is_dir() else []


def base_recipe(mirror: str) -> str:
    """Everything the base image is made from: its hash names the cached image."""
    parts = [SUITE, mirror, *BASE_PACKAGES, PIP_CONF]
    parts += [f"{ca.name}:{hashlib.sha256(ca.read_bytes()).hexdigest()}" for ca in _local_cas()]
    return "\n".join(parts)


def base_image(podman: Podman) -> str:
    """The reference of the Debian base image, built (once per recipe, under a lock) if missing."""
    mirror = machine_mirror()
    recipe_hash = hashlib.sha256(base_recipe(mirror).encode()).hexdigest()[:12]
    tag = f"localhost/inplace-extension-base:{SUITE}-{recipe_hash}"
    with file_lock(CACHE_DIR / "base.lock", timeout=BASE_BUILD_TIMEOUT + 60, what="base image lock"):
        if not podman.image_exists(tag):
            _build_base(podman, tag, mirror)
    return tag


def _build_base(podman: Podman, tag: str, mirror: str) -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        pip_conf = Path(tmp) / "pip.conf"
        pip_conf.write_text(PIP_CONF)
        hooks = [f"--customize-hook=upload {pip_conf} /etc/pip.conf"]
        cas = _local_cas()
        if cas:
            hooks += [
                f"--customize-hook=copy-in {' '.join(str(c) for c in cas)} /usr/local/share/ca-certificates",
                '--customize-hook=chroot "$1" update-ca-certificates',
            ]
        options = ["--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", *hooks]
        argv = ["mmdebstrap", *options, SUITE, str(rootfs), mirror]
        _checked(argv, BASE_BUILD_TIMEOUT)
        # the python image's locale: the same text handling as the default base
        podman.run("import", "--change", "ENV=LANG=C.UTF-8", str(rootfs), tag, timeout=300)


def _checked(argv: Sequence[str], timeout: float) -> None:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"{argv[0]} timed out after {timeout:g}s") from exc
    if proc.returncode != 0:
        raise EngineError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def _build_files() -> Iterator[Path]:
    for name in BUILD_INPUTS:
        yield ROOT / name
    for tree in BUILD_TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path


def context_hash(base: str) -> str:
    """A hash of everything the image build reads: the base image and each file of the build context."""
    digest = hashlib.sha256(base.encode())
    for path in _build_files():
        digest.update(f"\0{path.relative_to(ROOT)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def service_image(podman: Podman) -> str:
    """The project's image (``podman build`` of the Dockerfile on :func:`base_image`), built once per
    content: its reference ``localhost/inplace-extension-test:<hash of the build's inputs>``."""
    base = base_image(podman)
    tag = f"{SERVICE_REPOSITORY}:{context_hash(base)}"
    with file_lock(CACHE_DIR / "service.lock", timeout=SERVICE_BUILD_TIMEOUT + 60, what="service image lock"):
        if not podman.image_exists(tag):
            with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="build-") as tmp:
                build = ["build", "--format=docker", "--layers=false", "--force-rm", f"--tag={tag}"]
                inputs = [f"--build-arg=BASE_IMAGE={base}", f"--iidfile={Path(tmp) / 'iid'}", str(ROOT)]
                podman.run(*build, *inputs, timeout=SERVICE_BUILD_TIMEOUT)
            _prune_service_images(podman, keep=tag)
    return tag


def _prune_service_images(podman: Podman, keep: str) -> None:
    """Remove old builds of other content (the newest few stay, and any built within the last hour:
    another session may be using its own). An image a container still uses is not removed."""
    listed = podman.run("images", "--format", "{{.Repository}}:{{.Tag}} {{.CreatedAt}}", SERVICE_REPOSITORY)
    refs = [line.split(" ", 1)[0] for line in listed.splitlines() if line.strip()]
    created = {}
    for ref in refs:
        stamp = podman.run("image", "inspect", "--format", "{{.Created.Unix}}", ref).strip()
        created[ref] = int(stamp) if stamp.isdigit() else int(time.time())
    newest_first = sorted(created, key=created.__getitem__, reverse=True)
    for ref in newest_first[KEEP_SERVICE_IMAGES:]:
        if ref != keep and time.time() - created[ref] > KEEP_YOUNGER_THAN:
            subprocess.run(podman.argv("rmi", ref), capture_output=True, timeout=120, check=False)
