"""Where kubelab keeps things; every location can be overridden by an environment variable.

- ``KUBELAB_CACHE_DIR`` (default ``/var/cache/inplace-extension/kubelab``): built binaries, one
  directory per wrapper module and content hash, with the build logs and the build lock. Outside any
  clone, so every checkout and CI run on the machine reuses it.
- ``KUBELAB_RUN_DIR`` (default ``/run/kubelab``): one directory per running lab (state file, PKI,
  kubeconfig, etcd data, component logs).
- ``KUBELAB_GO`` (default ``go`` on PATH): the Go toolchain used for builds (``GOTOOLCHAIN=local``:
  a newer toolchain is never downloaded behind the user's back).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

GO_MODULES_DIR = Path(__file__).resolve().parent / "go"  # the wrapper modules (go.mod + go.sum)
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
# The apiserver's name in its serving certificate besides 127.0.0.1: real nodes (flavour "nodes") reach it
# through their lab's gateway and map this name to that address in their /etc/hosts
APISERVER_NAME = "kubelab-apiserver"
KWOK_NODE_LABEL = "type=kwok"  # kwok manages exactly the Nodes carrying this label


@dataclass(frozen=True)
class Config:
    cache_dir: Path
    run_dir: Path
    go: str

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ
        return cls(
            cache_dir=Path(env.get("KUBELAB_CACHE_DIR", "/var/cache/inplace-extension/kubelab")),
            run_dir=Path(env.get("KUBELAB_RUN_DIR", "/run/kubelab")),
            go=env.get("KUBELAB_GO", "go"),
        )

    @property
    def bin_root(self) -> Path:
        return self.cache_dir / "bin"

    def lab_dir(self, name: str) -> Path:
        return self.run_dir / "labs" / name
