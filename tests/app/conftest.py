"""App fixtures: the real Starlette app over httpx.ASGITransport, and the CAPI request bodies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inplace_extension.app import create_app
from inplace_extension.runs.model import Runs
from inplace_extension.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "capi"
API = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
PATHS = {
    "discovery": f"{API}/discovery",
    "can-update-machine": f"{API}/canupdatemachine/can-update-machine",
    "can-update-machineset": f"{API}/canupdatemachineset/can-update-machineset",
    "update-machine": f"{API}/updatemachine/update-machine",
}


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fixture_bytes(name))
    return data


def client_for(settings: Settings, runs: Runs | None = None) -> httpx.AsyncClient:
    app = create_app(settings, runs)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://capi.test")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(Settings(plain_http=True)) as c:
        yield c
