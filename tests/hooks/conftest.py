"""Hook-layer fixtures: the real app over httpx.ASGITransport, CAPI fixture bodies, a fake executor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

from inplace_extension.app import create_app
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.runs.model import Progress, ProgressState, RunRequest, Runs
from inplace_extension.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "capi"
API = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
CAN_UPDATE_MACHINE = f"{API}/canupdatemachine/can-update-machine"
CAN_UPDATE_MACHINE_SET = f"{API}/canupdatemachineset/can-update-machineset"
UPDATE_MACHINE = f"{API}/updatemachine/update-machine"
TOKEN = "abcdef.0123456789abcdef"  # the bootstrap token placeholder in the 6A/6B fixtures


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


async def post(
    path: str, body: Any, runs: Runs | None = None, custom: CustomTable = NO_CUSTOM, **settings: Any
) -> dict[str, Any]:
    """POST ``body`` to the hook at ``path`` of the real app (over ASGI); the answer, which is an HTTP 200."""
    app = create_app(Settings(plain_http=True, **settings), runs, custom=custom)
    return await post_to(app, path, body)


async def post_to(app: Starlette, path: str, body: Any) -> dict[str, Any]:
    """POST ``body`` to the hook at ``path`` of ``app`` (over ASGI); the answer, which is an HTTP 200."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://capi.test"
    ) as client:
        reply = await client.post(path, content=json.dumps(body).encode())
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


class FakeRuns:
    """Records every RunRequest and answers a fixed Progress."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress or Progress(ProgressState.IN_PROGRESS, "running kubeadm_files", 0)
        self.requests: list[RunRequest] = []

    async def poll(self, request: RunRequest) -> Progress:
        self.requests.append(request)
        return self.progress
