"""Where the lab keeps things and how it names them; every knob can be overridden by an environment variable.

- ``HOSTLAB_CACHE_DIR`` (default ``/var/cache/inplace-extension/hostlab``): the Debian base rootfs built
  once per machine (and the nodes' root filesystem), its build log and lock, and the apt proxy's package
  cache. Outside any clone, so every checkout and CI run on the machine reuses it.
- ``HOSTLAB_RUN_DIR`` (default ``/run/hostlab``): one directory per running lab (state file, SSH keys,
  known_hosts, host consoles, proxy log) plus the slot lock.
- ``HOSTLAB_SUITE`` (default ``bookworm``), ``HOSTLAB_MIRROR`` (default: the machine's own apt mirror),
  ``HOSTLAB_BOOTSTRAP`` (``debootstrap`` or ``mmdebstrap``; default: mmdebstrap if installed).
- ``HOSTLAB_BASE_DIR``: use this base rootfs instead of the cached one (it must carry the marker).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# Bump when the base rootfs recipe changes: the base directory name carries it, so an old base is
# never reused with a new recipe and a live lab's lower layer is never replaced under it.
BASE_FORMAT = 1
# the nodes' root filesystem is named by a hash of its whole recipe (hostlab.node_base.node_base_dir),
# this number included: bump it for a change the recipe's text does not show (a new configure step)
NODE_BASE_FORMAT = 2

LAB_NETWORK_PREFIX = "10.77"  # each lab gets 10.77.<slot>.0/24
MIN_SLOT = 1
MAX_SLOT = 254
MAX_HOSTS = 200  # host n gets .10+n
PROXY_PORT = 3142
DEFAULT_DISK_MB = 768  # per-host tmpfs upper layer: what "fill the disk" fills
LOGIN_USER = "ansible"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


@dataclass(frozen=True)
class Config:
    cache_dir: Path
    run_dir: Path
    suite: str
    mirror: str
    bootstrap: str
    base_override: Path | None

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ
        override = env.get("HOSTLAB_BASE_DIR")
        return cls(
            cache_dir=Path(env.get("HOSTLAB_CACHE_DIR", "/var/cache/inplace-extension/hostlab")),
            run_dir=Path(env.get("HOSTLAB_RUN_DIR", "/run/hostlab")),
            suite=env.get("HOSTLAB_SUITE", "bookworm"),
            mirror=env.get("HOSTLAB_MIRROR", "") or machine_mirror(),
            bootstrap=env.get("HOSTLAB_BOOTSTRAP", ""),
            base_override=Path(override) if override else None,
        )

    @property
    def base_dir(self) -> Path:
        if self.base_override is not None:
            return self.base_override
        return self.cache_dir / f"base-{self.suite}-v{BASE_FORMAT}"

    @property
    def apt_cache_dir(self) -> Path:
        return self.cache_dir / "aptcache"

    def lab_dir(self, name: str) -> Path:
        return self.run_dir / "labs" / name


def _apt_source_texts() -> list[str]:
    paths = [Path("/etc/apt/sources.list")]
    src_d = Path("/etc/apt/sources.list.d")
    if src_d.is_dir():
        paths += sorted(src_d.glob("*.sources")) + sorted(src_d.glob("*.list"))
    texts = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        texts.append("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return texts


def machine_mirror() -> str:
    """The Debian mirror this machine's apt uses (first ``.../debian`` URI), else deb.debian.org."""
    for text in _apt_source_texts():
        for match in re.finditer(r"(https?://[A-Za-z0-9.:-]+/[^\s]*)", text):
            uri = match.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def machine_apt_hosts() -> set[str]:
    """Host names of every mirror in this machine's apt sources: the apt proxy's allow-list."""
    hosts = set()
    for text in _apt_source_texts():
        for match in re.finditer(r"https?://([A-Za-z0-9.-]+)", text):
            hosts.add(match.group(1).lower())
    return hosts or {"deb.debian.org"}
