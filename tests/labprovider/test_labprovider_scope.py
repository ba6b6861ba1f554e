"""Lab-free: a lab provider controller started for one namespace lists only that namespace's LabClusters
and LabMachines, so controllers of different pools share one API server (the CAPI lab, used by test
modules on several workers at once) without taking each other's LabMachines; without a namespace it
lists every namespace's."""

from __future__ import annotations

from typing import Any, cast

import httpx
from hostlab.lab import Lab as HostLab
from kubelab.labprovider import component, crds
from kubelab.labprovider.controller import Api, Provider


class ListingApi(Api):
    """An Api that records the lists asked for and finds nothing (no API server)."""

    def __init__(self) -> None:
        super().__init__(httpx.Client())
        self.listed: list[str] = []

    def items(self, path: str) -> list[dict[str, Any]]:
        self.listed.append(path)
        return []


def _listed(namespace: str | None) -> list[str]:
    api = ListingApi()
    provider = Provider(api, cast(HostLab, None), ["node1"], log=lambda _: None, namespace=namespace)
    try:
        provider.reconcile()
    finally:
        provider.stop()
        api.client.close()
    return api.listed


def test_a_namespaced_controller_lists_only_its_namespace() -> None:
    base = f"/apis/{crds.API_VERSION}"
    assert _listed("wl-1") == [f"{base}/namespaces/wl-1/labclusters", f"{base}/namespaces/wl-1/labmachines"]
    assert _listed(None) == [f"{base}/labclusters", f"{base}/labmachines"]


def test_each_namespace_has_its_own_component() -> None:
    assert component("wl-1") != component("wl-2") != component(None)
    assert component(None) == "lab-provider"
