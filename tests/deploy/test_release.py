"""scripts/release renders files that validate, ask for the allowed networks and match deploy/."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .support import KUBERNETES_VERSIONS, ROOT, kustomize, validation_errors

VARIABLE = re.compile(r"\$\{([A-Z_]+)(?::=([^}]*))?\}")


def render(tmp_path: Path, **env: str) -> Path:
    """Run scripts/release with a PATH that holds no program at all (no kubectl): it renders by itself."""
    out = tmp_path / "dist"
    empty = tmp_path / "empty-path"
    empty.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, ROOT / "scripts" / "release", "v0.1.0", "--out", out],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": str(empty), **env},
    )
    return out


def by_name(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(docs, key=lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]))


@pytest.mark.parametrize("directory", ["deploy", "deploy/mcm"])
def test_the_release_renders_each_kustomization_as_kustomize_does(directory: str) -> None:
    """scripts/release's own rendering (no kubectl for the user) is the real kustomize's, each object."""
    loader = importlib.machinery.SourceFileLoader("release", str(ROOT / "scripts" / "release"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    ours = [d for d in yaml.safe_load_all(module.render_kustomization(ROOT / directory)) if d]
    assert by_name(ours) == by_name(kustomize(ROOT / directory))


def test_components_have_clusterctl_variables_and_no_default_network(tmp_path: Path) -> None:
    out = render(tmp_path)
    text = (out / "runtime-extension-inplace-extension/v0.1.0/runtime-extension-components.yaml").read_text()
    variables = {m.group(1): m.group(2) for m in VARIABLE.finditer(text)}
    assert variables == {
        "INPLACE_NAMESPACE": "inplace-extension-system",
        "INPLACE_IMAGE": "docker.io/library/inplace-extension:0.1.0",  # canonical, as clusterctl wants it
        "INPLACE_ALLOWED_CIDRS": None,  # required: clusterctl refuses to install without it
    }
    # what clusterctl makes of them (substituted, validated): tests/deploy/test_clusterctl.py
    metadata = yaml.safe_load((out / "runtime-extension-inplace-extension/v0.1.0/metadata.yaml").read_text())
    assert metadata["releaseSeries"] == [{"major": 0, "minor": 1, "contract": "v1beta2"}]
    assert "type: RuntimeExtensionProvider" in (out / "clusterctl.yaml").read_text()


def test_mcm_agent_manifest_takes_the_values_and_validates(tmp_path: Path) -> None:
    out = render(tmp_path, INPLACE_ALLOWED_CIDRS="10.2.0.0/16", INPLACE_MCM_NAMESPACE="shoot--a")
    docs = [d for d in yaml.safe_load_all((out / "mcm-agent.yaml").read_text()) if d]
    for doc in docs:
        assert validation_errors(doc, KUBERNETES_VERSIONS[-1]) == [], doc["kind"]
    env = {
        e["name"]: e["value"]
        for d in docs
        if d["kind"] == "Deployment"
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e  # INPLACE_AGENT_ID comes from the Pod's name (valueFrom)
    }
    assert env["INPLACE_ALLOWED_CIDRS"] == "10.2.0.0/16" and env["INPLACE_MCM_NAMESPACE"] == "shoot--a"
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["metadata"]["namespace"] == "shoot--a"
    unset = [
        d for d in yaml.safe_load_all((render(tmp_path / "b").joinpath("mcm-agent.yaml")).read_text()) if d
    ]
    assert "INPLACE_ALLOWED_CIDRS" not in str(unset)


def test_shipped_base_allows_no_network_and_examples_set_one() -> None:
    config = next(d for d in kustomize(ROOT / "deploy") if d["kind"] == "ConfigMap")
    assert "INPLACE_ALLOWED_CIDRS" not in config["data"]
    for example in ("kube-aware", "client-auth"):
        rendered = kustomize(ROOT / "examples" / "overlays" / example)
        data = next(d for d in rendered if d["kind"] == "ConfigMap")["data"]
        assert data["INPLACE_ALLOWED_CIDRS"] == "10.1.0.0/16"
