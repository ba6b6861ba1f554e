"""The release as the real clusterctl reads it: ``clusterctl generate provider --runtime-extension
inplace-extension:v0.1.0 --config dist/clusterctl.yaml`` on what scripts/release wrote, and ``clusterctl
init`` of it (with CAPI's providers from the same file repository) on a kubelab API server.

clusterctl is built by kubelab from ``sigs.k8s.io/cluster-api/cmd/clusterctl`` at the CAPI release the
capi flavour runs (labs/kubelab/build.py). It reads ``dist/clusterctl.yaml`` (the provider's file
repository), the version directory's ``metadata.yaml`` (the release series of v0.1) and the components,
and substitutes the variables; these tests check what it printed, and that it refuses the release
without ``INPLACE_ALLOWED_CIDRS``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostlab.errors import LabError
from kubelab import build
from kubelab.config import Config
from kubelab.lab import Lab
from kubelab.manifests import cert_manager_crds, install_crds
from kubelab.pytest_plugin import unavailable

from .support import KUBERNETES_VERSIONS, ROOT, kustomize, validation_errors
from .test_release import render

pytestmark = pytest.mark.kube
PROVIDER = "inplace-extension:v0.1.0"


@pytest.fixture(scope="module")
def clusterctl() -> Path:
    """The clusterctl binary (kubelab's cached build; built once per machine and CAPI release)."""
    try:
        return build.ensure_built(["clusterctl"], Config.from_env())["clusterctl"]
    except LabError as exc:
        unavailable(f"clusterctl cannot be built: {exc}")


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render(tmp_path_factory.mktemp("release"))


def generate(
    clusterctl: Path, release: Path, home: Path, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``clusterctl generate provider`` with only ``variables`` set; its config home under ``home``, no
    version check (it would ask GitHub)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
        **variables,
    }
    argv = [str(clusterctl), "generate", "provider", "--runtime-extension", PROVIDER]
    return subprocess.run(
        [*argv, "--config", str(release / "clusterctl.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_clusterctl_refuses_the_release_without_the_allowed_networks(
    clusterctl: Path, release: Path, tmp_path: Path
) -> None:
    result = generate(clusterctl, release, tmp_path)
    assert result.returncode != 0
    assert "INPLACE_ALLOWED_CIDRS" in result.stderr, result.stderr


def test_clusterctl_renders_the_release_with_its_variables(
    clusterctl: Path, release: Path, tmp_path: Path
) -> None:
    result = generate(
        clusterctl,
        release,
        tmp_path,
        INPLACE_ALLOWED_CIDRS="10.1.0.0/16,10.2.0.0/16",
        INPLACE_NAMESPACE="infra",
        INPLACE_IMAGE="registry.example.com/inplace-extension:0.1.0-rc1",
    )
    assert result.returncode == 0, result.stderr
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(result.stdout) if d]
    # every object of deploy/, in the namespace asked for
    expected = sorted(
        (d["kind"], d["metadata"]["name"].replace("inplace-extension-system", "infra"))
        for d in kustomize(ROOT / "deploy")
    )
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == expected
    assert {d["metadata"].get("namespace", "infra") for d in docs} == {"infra"}
    extension = next(d for d in docs if d["kind"] == "ExtensionConfig")
    assert extension["spec"]["clientConfig"]["service"]["namespace"] == "infra"
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["INPLACE_ALLOWED_CIDRS"] == "10.1.0.0/16,10.2.0.0/16"
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/inplace-extension:0.1.0-rc1"
    # clusterctl's own mark: it read the provider from the file repository by its name
    assert {d["metadata"]["labels"].get("cluster.x-k8s.io/provider") for d in docs} == {
        "runtime-extension-inplace-extension"
    }
    assert "${" not in result.stdout  # every variable substituted
    for version in KUBERNETES_VERSIONS:
        for doc in docs:
            assert validation_errors(doc, version) == [], doc["kind"]


def test_clusterctl_takes_the_defaults_of_the_namespace_and_the_image(
    clusterctl: Path, release: Path, tmp_path: Path
) -> None:
    result = generate(clusterctl, release, tmp_path, INPLACE_ALLOWED_CIDRS="10.1.0.0/16")
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {d["metadata"].get("namespace", "inplace-extension-system") for d in docs} == {
        "inplace-extension-system"
    }
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert (
        image == "docker.io/library/inplace-extension:0.1.0"
    )  # what Kubernetes reads inplace-extension:0.1.0 as


# CAPI's providers clusterctl init adds on a new management cluster, from the pinned CAPI module:
# (provider name, type directory and file clusterctl's file repository expects, kustomize directory)
CAPI_PROVIDERS = (
    ("cluster-api", "CoreProvider", "cluster-api", "core-components.yaml", "core/config/default"),
    (
        "kubeadm",
        "BootstrapProvider",
        "bootstrap-kubeadm",
        "bootstrap-components.yaml",
        "bootstrap/kubeadm/config/default",
    ),
    (
        "kubeadm",
        "ControlPlaneProvider",
        "control-plane-kubeadm",
        "control-plane-components.yaml",
        "controlplane/kubeadm/config/default",
    ),
)
WEBHOOK_KINDS = {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}


@pytest.fixture(scope="module")
def management_lab() -> Iterator[Lab]:
    """A kubelab core of its own (API server, controller manager, kwok): clusterctl init writes CAPI's
    CRDs, which must not reach the per-worker lab other kube tests use."""
    lab = Lab(f"pytest-clusterctl-{os.getpid()}", Config.from_env())
    try:
        lab.up()
    except LabError as exc:
        lab.down()
        unavailable(f"the kubelab did not start: {exc}")
    try:
        yield lab
    finally:
        lab.down()


def capi_repository(lab: Lab, directory: Path) -> list[str]:
    """CAPI's core, kubeadm bootstrap and control plane providers as clusterctl's file repository wants
    them, rendered from the pinned module as its release does (kustomize), without their webhook
    configurations: nothing serves CAPI's webhooks in this lab (its controllers are kwok Pods), and the
    API server would refuse every write they cover. Returns clusterctl.yaml's provider entries."""
    module = build.module_source(lab.cfg, "capi", "sigs.k8s.io/cluster-api")
    entries = []
    for name, kind, label, file_name, source in CAPI_PROVIDERS:
        rendered = lab.kubectl("kustomize", str(module / source)).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] not in WEBHOOK_KINDS]
        version_dir = directory / label / build.CAPI_VERSION
        version_dir.mkdir(parents=True)
        (version_dir / file_name).write_text(yaml.safe_dump_all(docs), encoding="utf-8")
        shutil.copy(module / "metadata.yaml", version_dir / "metadata.yaml")
        entries.append(f"  - name: {name}\n    url: file://{version_dir / file_name}\n    type: {kind}\n")
    return entries


def test_clusterctl_init_installs_the_release_on_the_lab_api_server(
    clusterctl: Path, release: Path, management_lab: Lab, tmp_path: Path
) -> None:
    lab = management_lab
    install_crds(lab, cert_manager_crds(lab))  # cert-manager's API, without its controllers (see below)
    config = tmp_path / "clusterctl.yaml"
    own = (release / "clusterctl.yaml").read_text(encoding="utf-8")
    config.write_text(
        own
        + "".join(capi_repository(lab, tmp_path / "repository"))
        # cert-manager's controllers do not run here: clusterctl is told so and only checks its API
        + 'cert-manager:\n  externallyProvisioned: "true"\n',
        encoding="utf-8",
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
        "INPLACE_ALLOWED_CIDRS": "10.1.0.0/16",
    }
    argv = [str(clusterctl), "init", "--config", str(config), "--kubeconfig", str(lab.kubeconfig)]
    result = subprocess.run(
        [*argv, "--core", f"cluster-api:{build.CAPI_VERSION}", "--runtime-extension", PROVIDER],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    print(output)  # clusterctl's account of what it installed, for the test's log
    assert "Skipping installing cert-manager as it is already installed" in output
    assert 'Installing provider="runtime-extension-inplace-extension" version="v0.1.0"' in output
    # clusterctl's inventory: our provider, installed where the release says, beside CAPI's
    providers = json.loads(
        lab.kubectl("get", "providers.clusterctl.cluster.x-k8s.io", "-A", "-o", "json").stdout
    )
    installed = {
        (p["metadata"]["namespace"], p["providerName"], p["type"], p["version"]) for p in providers["items"]
    }
    assert (
        "inplace-extension-system",
        "inplace-extension",
        "RuntimeExtensionProvider",
        "v0.1.0",
    ) in installed
    assert ("capi-system", "cluster-api", "CoreProvider", build.CAPI_VERSION) in installed
    extension = json.loads(lab.kubectl("get", "extensionconfig", "inplace-extension", "-o", "json").stdout)
    assert extension["spec"]["clientConfig"]["service"]["namespace"] == "inplace-extension-system"
    data = json.loads(
        lab.kubectl(
            "get", "-n", "inplace-extension-system", "configmap", "inplace-extension-config", "-o", "json"
        ).stdout
    )["data"]
    assert data["INPLACE_ALLOWED_CIDRS"] == "10.1.0.0/16"
