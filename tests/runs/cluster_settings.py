"""The Settings of the Kubernetes-aware mode's run tests: an inventory with no entry, so a host's address
comes from its Machine and only the inventory's defaults (the SSH user and host key) apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inplace_extension.settings import Settings

from .test_service import KEY, PLAYBOOKS


def cluster_side_settings(tmp_path: Path, **more: Any) -> Settings:
    """Settings for a RunService with a cluster side; ``more`` adds or overrides fields (a kubeconfig...)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f'hosts: []\ndefaults: {{user: ansible, known_hosts: "{KEY}"}}\n')
    fields: dict[str, Any] = {
        "inventory": inventory,
        "allowed_cidrs": ["10.79.9.0/24"],
        "runs_dir": tmp_path / "runs",
        "playbooks_dir": PLAYBOOKS,
        "retry_after_seconds": 1,
    }
    return Settings(**(fields | more))
