"""The ``kube`` fixture of the MCM agent tests: the session's kubelab with MCM's CRDs and the test
namespace (module scope: each module starts from the same cluster, objects are uniquely named)."""

from __future__ import annotations

import pytest
from kubelab import manifests, objects
from kubelab.flavours import mcm
from kubelab.lab import Lab

from .lab_objects import NAMESPACE


@pytest.fixture(scope="module")
def kube(kubelab: Lab) -> Lab:
    manifests.install_crds(kubelab, mcm.crd_files(kubelab), only_missing=True)
    objects.ensure_namespace(kubelab, NAMESPACE)
    return kubelab
