"""kubelab.manifests without a lab: a CRD file's name is read from the file, as ``kubectl create
--dry-run=client -o name`` gives it; a file of another shape is still left to kubectl."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from kubelab import manifests

CRD_FILE = """---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  annotations:
    controller-gen.kubebuilder.io/version: v0.18.0
  name: machines.cluster.x-k8s.io
spec:
  group: cluster.x-k8s.io
"""


class KubectlRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def kubectl(self, *args: str, **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        return subprocess.CompletedProcess(list(args), 0, "configmap/a\nconfigmap/b\n", "")


def test_a_crd_files_name_is_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "crd.yaml"
    path.write_text(CRD_FILE)
    lab = KubectlRecorder()
    name = manifests.object_name(lab, path)  # type: ignore[arg-type]
    assert name == "customresourcedefinition.apiextensions.k8s.io/machines.cluster.x-k8s.io"
    assert lab.calls == []


def test_a_file_of_another_shape_is_named_by_kubectl(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("kind: ConfigMap\nmetadata: {name: a}\n---\nkind: ConfigMap\nmetadata: {name: b}\n")
    lab = KubectlRecorder()
    assert manifests.object_name(lab, path) == "configmap/a\nconfigmap/b"  # type: ignore[arg-type]
    assert lab.calls == [("create", "--dry-run=client", "-o", "name", "-f", str(path))]
