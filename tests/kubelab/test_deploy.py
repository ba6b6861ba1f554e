"""deploy/ against a real API server: every resource of the kustomize base (and of the base with the
client-auth component) passes a server-side dry run, with cert-manager's and CAPI's CRDs installed
from their pinned Go modules. Nothing is stored: a dry run only asks the server for its verdict.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubelab import manifests
from kubelab.lab import Lab

pytestmark = pytest.mark.kube

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXTENSIONCONFIG_CRD = "runtime.cluster.x-k8s.io_extensionconfigs.yaml"


@pytest.fixture(scope="module")
def with_crds(kubelab: Lab) -> Lab:
    files = [*manifests.cert_manager_crds(kubelab), manifests.capi_crd(kubelab, EXTENSIONCONFIG_CRD)]
    installed = manifests.install_crds(kubelab, files, only_missing=True)
    assert {"certificates.cert-manager.io", "extensionconfigs.runtime.cluster.x-k8s.io"} <= set(installed)
    # namespaced resources are judged inside their namespace, which a dry run would not create
    kubelab.kubectl("apply", "--server-side", "--field-manager=kubelab", "-f", str(DEPLOY / "namespace.yaml"))
    return kubelab


def _overlay(tmp_path: Path, patch: dict[str, object] | None = None, component: bool = False) -> Path:
    overlay: dict[str, object] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, tmp_path)],
    }
    if component:
        overlay["components"] = [os.path.relpath(DEPLOY / "components" / "client-auth", tmp_path)]
    if patch is not None:
        (tmp_path / "patch.yaml").write_text(yaml.safe_dump(patch))
        overlay["patches"] = [{"path": "patch.yaml"}]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return tmp_path


def _kinds(output: str) -> set[str]:
    return {line.split("/")[0].split(".")[0] for line in output.splitlines() if "server dry run" in line}


def test_the_base_passes_a_server_side_dry_run(with_crds: Lab) -> None:
    result = manifests.dry_run_kustomize(with_crds, DEPLOY)
    assert result.returncode == 0, result.stderr
    assert {"deployment", "service", "certificate", "extensionconfig", "configmap"} <= _kinds(result.stdout)


def test_the_client_auth_component_passes_a_server_side_dry_run(with_crds: Lab, tmp_path: Path) -> None:
    result = manifests.dry_run_kustomize(with_crds, _overlay(tmp_path, component=True))
    assert result.returncode == 0, result.stderr
    assert "deployment" in _kinds(result.stdout)


def test_the_dry_run_really_validates(with_crds: Lab, tmp_path: Path) -> None:
    # the same base with one value the schema refuses: the server must say no, naming the field
    bad: dict[str, object] = {
        "apiVersion": "runtime.cluster.x-k8s.io/v1beta2",
        "kind": "ExtensionConfig",
        "metadata": {"name": "inplace-extension"},
        "spec": {"clientConfig": {"service": {"port": "https"}}},
    }
    result = manifests.dry_run_kustomize(with_crds, _overlay(tmp_path, patch=bad))
    assert result.returncode != 0
    assert "spec.clientConfig.service.port" in result.stderr


def test_the_kube_aware_component_passes_a_server_side_dry_run(with_crds: Lab, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY, overlay)],
                "components": [os.path.relpath(DEPLOY / "components" / "kube-aware", overlay)],
            }
        )
    )
    result = manifests.dry_run_kustomize(with_crds, overlay)
    assert result.returncode == 0, result.stderr
    assert {"clusterrole", "clusterrolebinding", "deployment"} <= _kinds(result.stdout)


def test_the_release_components_pass_a_server_side_dry_run(with_crds: Lab, tmp_path: Path) -> None:
    # scripts/release's runtime-extension-components.yaml with the values clusterctl would substitute
    out = tmp_path / "dist"
    release = [sys.executable, str(ROOT / "scripts" / "release"), "v0.1.0", "--out", str(out)]
    subprocess.run(release, check=True, capture_output=True)
    text = (out / "runtime-extension-inplace-extension/v0.1.0/runtime-extension-components.yaml").read_text()
    values = {"INPLACE_ALLOWED_CIDRS": "10.1.0.0/16"}
    text = re.sub(r"\$\{([A-Z_]+)(?::=([^}]*))?\}", lambda m: values.get(m.group(1)) or m.group(2), text)
    overlay = tmp_path / "release"
    overlay.mkdir()
    (overlay / "components.yaml").write_text(text)
    (overlay / "kustomization.yaml").write_text("resources:\n  - components.yaml\n")
    result = manifests.dry_run_kustomize(with_crds, overlay)
    assert result.returncode == 0, result.stderr
    assert {"deployment", "service", "certificate", "extensionconfig", "configmap"} <= _kinds(result.stdout)
