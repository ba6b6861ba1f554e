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
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
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
