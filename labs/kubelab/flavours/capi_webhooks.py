"""CAPI's CRDs and webhook configurations as the capi flavour installs them, read from the module zips.

What CAPI's kustomize overlays would do in a real install (a Service per controller, cert-manager
injecting the CA), done here on the parsed YAML because the controllers run as local processes:

- CRDs: every file of ``<config>/crd/bases/``, with the labels of ``<config>/crd/kustomization.yaml``
  (the KCP, CABPK and CAPD contract labels ``cluster.x-k8s.io/v1beta1``/``v1beta2``, without which
  core cannot tell which contract version a provider kind speaks) and, for every CRD that has a
  ``crd/patches/webhook_in_<plural>.yaml``, a conversion webhook at the owning controller's
  ``https://127.0.0.1:<port>/convert`` with the lab CA as ``caBundle``.
- Webhook configurations: ``<config>/webhook/manifests.yaml`` (one mutating, one validating per
  controller: eight in all), each renamed ``<name>-<controller>`` (they all share two names upstream)
  and every ``clientConfig.service`` replaced by ``url`` + ``caBundle``.

Everything is read at run time from the pinned modules (never copied into the repository), so a CAPI
version bump brings its own CRDs and webhooks along.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]
# libyaml's loader when PyYAML has it: the KCP CRD alone is 1 MB of YAML
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _docs(path: Path) -> list[Doc]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


def _kustomization(config_dir: Path) -> Doc:
    loaded = yaml.load((config_dir / "crd" / "kustomization.yaml").read_text(), Loader=_LOADER)  # noqa: S506
    return loaded if isinstance(loaded, dict) else {}


def contract_labels(config_dir: Path) -> dict[str, str]:
    """The labels the CRD kustomization puts on every CRD (empty for core, which owns the contract)."""
    labels: dict[str, str] = {}
    for entry in _kustomization(config_dir).get("labels", []) or []:
        labels.update({str(k): str(v) for k, v in (entry.get("pairs") or {}).items()})
    return labels


def conversion_crds(config_dir: Path) -> set[str]:
    """Names of the CRDs whose kustomization enables the conversion webhook (``webhook_in_*`` patches)."""
    names = set()
    for patch in _kustomization(config_dir).get("patches", []) or []:
        path = patch.get("path", "") if isinstance(patch, dict) else ""
        if Path(path).name.startswith("webhook_in_"):
            for doc in _docs(config_dir / "crd" / path):
                names.add(doc["metadata"]["name"])
    return names


def ca_bundle(ca_pem: bytes) -> str:
    return base64.b64encode(ca_pem).decode()


def prepared_crds(config_dir: Path, webhook_port: int, ca_pem: bytes) -> list[Doc]:
    """The controller's CRDs with its contract labels and conversion webhook (see the module docstring)."""
    labels = contract_labels(config_dir)
    converted = conversion_crds(config_dir)
    crds = []
    for path in sorted((config_dir / "crd" / "bases").glob("*.yaml")):
        for doc in _docs(path):
            crd = copy.deepcopy(doc)
            meta = crd.setdefault("metadata", {})
            meta["labels"] = {**(meta.get("labels") or {}), **labels}
            if meta["name"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{webhook_port}/convert",
                            "caBundle": ca_bundle(ca_pem),
                        },
                    },
                }
            crds.append(crd)
    return crds


def prepared_webhook_configurations(
    config_dir: Path, controller: str, webhook_port: int, ca_pem: bytes
) -> list[Doc]:
    """The controller's admission webhook configurations, renamed and pointed at its local port."""
    configs = []
    for doc in _docs(config_dir / "webhook" / "manifests.yaml"):
        config = copy.deepcopy(doc)
        config["metadata"] = {"name": f"{doc['metadata']['name']}-{controller}"}
        for webhook in config.get("webhooks", []):
            webhook["clientConfig"] = _url_client_config(webhook["clientConfig"], webhook_port, ca_pem)
        configs.append(config)
    return configs


def _url_client_config(client_config: Mapping[str, Any], port: int, ca_pem: bytes) -> Doc:
    service = client_config.get("service")
    if service is None:
        raise ValueError(f"webhook clientConfig without a service: {dict(client_config)}")
    return {"url": f"https://127.0.0.1:{port}{service.get('path', '/')}", "caBundle": ca_bundle(ca_pem)}
