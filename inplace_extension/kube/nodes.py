"""What the health gate reads from a workload Node: Ready, and the version its kubelet reports."""

from __future__ import annotations

from dataclasses import dataclass

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node

from inplace_extension.kube.machines import api_failure


@dataclass(frozen=True)
class NodeHealth:
    exists: bool
    ready: bool
    kubelet_version: str | None  # status.nodeInfo.kubeletVersion
    unschedulable: bool


def node_health(client: Client, node: str) -> NodeHealth:
    try:
        obj = client.get(Node, node)
    except ApiError as exc:
        if exc.response.status_code == 404:
            return NodeHealth(False, False, None, False)
        raise api_failure(f"get Node {node}", exc) from None
    status = obj.status
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or [] if status else []))
    info = status.nodeInfo if status else None
    return NodeHealth(
        exists=True,
        ready=ready,
        kubelet_version=info.kubeletVersion if info else None,
        unschedulable=bool(obj.spec and obj.spec.unschedulable),
    )
