"""Our service registered with the real CAPI v1.14.2 core through an ExtensionConfig (no emulator):
CAPI calls Discovery over TLS (our serving cert from the kubelab PKI, the lab CA as caBundle) and lists
our three handlers in ``status.handlers``; a wrong caBundle shows CAPI's own reason in ``Discovered``.
"""

from __future__ import annotations

import re
import time

import pytest
from kubelab import objects
from kubelab.flavours import capi_objects as co
from kubelab.pki import CertificateAuthority

from .conftest import Extension, extension_config, handlers_of

pytestmark = [pytest.mark.kube, pytest.mark.capi, pytest.mark.lab]


def test_capi_discovers_our_three_handlers(capi_extension: Extension) -> None:
    config = extension_config(capi_extension.kube, capi_extension.name)
    assert config is not None
    handlers = {h["name"]: h for h in config["status"]["handlers"]}
    assert set(handlers) == handlers_of(capi_extension.name)
    assert {h["requestHook"]["hook"] for h in handlers.values()} == {
        "CanUpdateMachine",
        "CanUpdateMachineSet",
        "UpdateMachine",
    }
    # Fail for every hook: a transport error must never read as "Success"
    # (docs/install-capi.md, "Why failurePolicy: Fail")
    assert {h["failurePolicy"] for h in handlers.values()} == {"Fail"}
    assert config["spec"]["clientConfig"]["url"] == capi_extension.service.url
    assert config["spec"]["clientConfig"]["url"].startswith("https://127.0.0.1:")
    # the call came from CAPI: our metrics counted it
    assert re.search(
        r'^inplace_extension_hook_calls_total\{hook="Discovery",status="Success"\} [1-9]',
        capi_extension.metrics(),
        re.M,
    )


def test_an_untrusted_serving_certificate_fails_discovery_with_capis_message(
    capi_extension: Extension, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other_ca = CertificateAuthority(tmp_path_factory.mktemp("other-ca")).pem
    name = f"{capi_extension.name}-untrusted"
    # selects no namespace: a second registered UpdateMachine handler would make CAPI refuse both
    objects.apply(
        capi_extension.kube,
        co.extension_config(name, capi_extension.service.url, other_ca, {"inplace-extension.io/nobody": "x"}),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            config = objects.get(capi_extension.kube, "extensionconfigs.runtime.cluster.x-k8s.io", name) or {}
            discovered = objects.condition(config, "Discovered") or {}
            if discovered.get("status") == "False":
                break
            assert time.monotonic() < deadline, f"no Discovered=False: {config.get('status')}"
            time.sleep(0.5)
        assert "x509" in discovered.get("message", "") or "certificate" in discovered.get("message", "")
        assert not config.get("status", {}).get("handlers")
    finally:
        capi_extension.kube.kubectl(
            "delete", "extensionconfigs.runtime.cluster.x-k8s.io", name, "--ignore-not-found", check=False
        )
