"""kubelab's one build table (labs/kubelab/build.py): which wrapper module builds the control plane at each
version, without building anything."""

from __future__ import annotations

import pytest
from hostlab.errors import LabError
from kubelab import build


def test_each_control_plane_version_is_built_by_one_module_never_twice() -> None:
    first, last = build.NODE_VERSIONS[0], build.NODE_VERSIONS[-1]
    assert last == build.KUBERNETES_VERSION  # the last node version's control plane is kubelab's own
    for component in build.CONTROL_PLANE:
        own = build.BINARIES[build.control_plane_binary(component, last)]
        older = build.BINARIES[build.control_plane_binary(component, first)]
        assert own.module == "k8s"
        # the older one beside its kubelet: one module, Go's build cache shared
        assert older.module == build.BINARIES[f"kubelet-{first}"].module == f"node-{first}"
        assert f"-X k8s.io/component-base/version.gitVersion={first}" in older.ldflags
    packages = [(b.module, b.package) for b in build.BINARIES.values()]
    assert len(packages) == len(set(packages)), "a package built twice in one module"
    assert set(build.CONTROL_PLANE_BINARIES) <= set(build.BINARIES)


def test_a_control_plane_version_kubelab_does_not_build_is_named() -> None:
    with pytest.raises(LabError, match=r"no control plane at v1\.30\.0"):
        build.control_plane_binary("kube-apiserver", "v1.30.0")
    with pytest.raises(LabError, match="kubelet is not a control-plane component"):
        build.control_plane_binary("kubelet", build.KUBERNETES_VERSION)
