"""Manifests in a lab: CRDs read from Go module zips (never copied into the repository), waits for
them to be served, and server-side dry runs of kustomize directories (the real API server's verdict
on ``deploy/``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from hostlab.errors import LabError
from hostlab.proc import wait_until

from kubelab import build, reads

if TYPE_CHECKING:
    from kubelab.lab import Lab

CRD_TIMEOUT = 60
CRD = "customresourcedefinition.apiextensions.k8s.io"
# libyaml's loader reads CAPI's 1 MB of CRDs in 0.1 s of CPU, a fraction of one kubectl start per file
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def cert_manager_crds(lab: Lab) -> list[Path]:
    """cert-manager's CRDs (plain YAML in its module zip, ``deploy/crds/``)."""
    return sorted((build.data_module(lab.cfg, "cert-manager") / "deploy" / "crds").glob("*.yaml"))


def capi_crd(lab: Lab, file_name: str) -> Path:
    """One CRD file of CAPI core as the pinned CAPI module ships it (``core/config/crd/bases/``)."""
    root = build.module_source(lab.cfg, "capi", "sigs.k8s.io/cluster-api")
    return root / "core" / "config" / "crd" / "bases" / file_name


def install_crds(lab: Lab, files: Iterable[Path], only_missing: bool = False) -> list[str]:
    """Apply CRD files (server-side) and wait until each is established; return the CRD names.

    ``only_missing``: leave a CRD that already exists alone (a flavour may have patched it, e.g. with
    its conversion webhook, and a plain re-apply would undo that).
    """
    names = []
    for path in files:
        name = object_name(lab, path)
        names.append(name)
        if only_missing and reads.get(lab, *name.split("/", 1)) is not None:
            continue
        lab.kubectl("apply", "--server-side", "--field-manager=kubelab", "-f", str(path))
    for name in names:
        wait_established(lab, name)
    return [n.removeprefix(f"{CRD}/") for n in names]


def object_name(lab: Lab, path: Path) -> str:
    """``<resource>/<name>`` of the one CRD in ``path``, as ``kubectl create --dry-run=client -o name``
    names it (which a file of another shape is still left to)."""
    documents = [d for d in yaml.load_all(path.read_text(), Loader=SAFE_LOADER) if d]
    if len(documents) == 1 and documents[0].get("kind") == "CustomResourceDefinition":
        name = documents[0].get("metadata", {}).get("name")
        if isinstance(name, str) and name:
            return f"{CRD}/{name}"
    return lab.kubectl("create", "--dry-run=client", "-o", "name", "-f", str(path)).stdout.strip()


def wait_established(lab: Lab, name: str, timeout: float = CRD_TIMEOUT) -> None:
    """Wait until the CRD ``name`` (``<resource>/<name>``) is Established. Polled rather than ``kubectl
    wait``, which fails at once (not after its timeout) on a CRD whose status has no conditions yet, as
    right after its apply."""

    def established() -> bool:
        try:
            crd = reads.get(lab, *name.split("/", 1))
        except LabError:
            return False
        # conditions null right after the apply, before the API server wrote any (seen 2026-11-26)
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    if not wait_until(established, timeout, 0.2):
        raise LabError(f"{name} did not become Established within {timeout:g}s")


def dry_run_kustomize(lab: Lab, directory: Path) -> subprocess.CompletedProcess[str]:
    """``kubectl apply --server-side --dry-run=server -k DIR``: the server validates, nothing is stored.

    ``--force-conflicts``: a lab shared with the capi flavour's tests may hold an object of the same name
    (our ExtensionConfig) applied by another field manager; a dry run takes nothing from it.
    """
    return lab.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=inplace-extension-test",
        "-k",
        str(directory),
        check=False,
    )
