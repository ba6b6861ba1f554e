"""The demo: CAPI's in-place decision as the demo plays it, and the whole demo end to end on a lab."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest
from hostlab import demo
from hostlab.lab import Lab


def _patch(ops: list[dict[str, object]]) -> dict[str, str]:
    return {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(ops).encode()).decode()}


def _request() -> dict[str, Any]:
    return {
        "current": demo.machine_set_objects(False, "ssh-ed25519 AAAA alice"),
        "desired": demo.machine_set_objects(True, "ssh-ed25519 AAAA alice"),
    }


def test_capi_goes_in_place_only_when_the_patches_cover_every_change() -> None:
    request = _request()
    desired_spec = request["desired"]["bootstrapConfigTemplate"]["spec"]["template"]["spec"]
    full = _patch(
        [
            {"op": "add", "path": "/spec/template/spec/files", "value": desired_spec["files"]},
            {"op": "add", "path": "/spec/template/spec/users", "value": desired_spec["users"]},
        ]
    )
    partial = _patch([{"op": "add", "path": "/spec/template/spec/files", "value": desired_spec["files"]}])
    assert demo.capi_decides_in_place(request, {"bootstrapConfigTemplatePatch": full}) == []
    assert demo.capi_decides_in_place(request, {"bootstrapConfigTemplatePatch": partial}) == [
        "bootstrapConfigTemplate"
    ]
    assert demo.capi_decides_in_place(request, {}) == ["bootstrapConfigTemplate"]


def test_merge_patches_are_applied_like_rfc_7386() -> None:
    obj = {"spec": {"a": 1, "b": {"c": 2}}}
    patch = {
        "patchType": "JSONMergePatch",
        "patch": base64.b64encode(b'{"spec": {"a": null, "b": {"d": 3}}}'),
    }
    assert demo.apply_patch(
        obj, {k: v.decode() if isinstance(v, bytes) else v for k, v in patch.items()}
    ) == {"spec": {"b": {"c": 2, "d": 3}}}


@pytest.mark.lab
def test_demo_runs_end_to_end(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"pytest-{os.getpid()}-demo"
    code = demo.main(["--lab-name", name, "--retry-after", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    out = captured.out
    assert "CanUpdateMachineSet demo-md-0-6d9f7c8b5x -> demo-md-0-8b4c6f9d2q: Success" in out
    assert "CAPI decision: update the 3 Machines in place" in out
    for machine in demo.MACHINES:
        assert f"{machine}: updated in" in out
    assert out.count(f"ssh login as {demo.DEMO_USER}     refused -> ok") == 3
    assert out.count("This node was updated in place by inplace-extension.") == 3
    assert demo.BOOTSTRAP_TOKEN not in out + captured.err
    assert not Lab(name, lab.cfg).exists()  # torn down
