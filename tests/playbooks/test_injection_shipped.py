"""Injection payloads in the shipped capabilities' inputs: the os_update field value and the
kubelet_credentials annotation value stay data on the controller and the host.

The os_update value reaches the (STAND-IN, shipped.py) update command as one whole argv item, never
through a shell or a template; an annotation payload is refused by the plan (RFC 3339), and even fed
to the role directly it lands only as literal text in the role's record. Companion of test_injection.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hostlab.lab import Host, Lab

from inplace_extension.inplace.plan import PlanError

from .shipped import ANNOTATION, STANDIN, desired, install_os_update_standin, plan_for, run_plan
from .support import host_exists, host_root, write_kubelet_credentials

pytestmark = pytest.mark.lab


def payload(sentinel: str) -> str:
    jinja = f"{{{{ lookup('pipe','touch {sentinel}') }}}}"
    return f"https://img.example/{jinja}/$(touch {sentinel})/`touch {sentinel}`"


def test_os_update_value_payloads_reach_the_command_as_one_literal_argument(
    lab: Lab, lab_hosts: list[Host], tmp_path: Path, sentinel: str
) -> None:
    host = lab_hosts[0]
    install_os_update_standin(lab, host, booted="1.0.0")
    url = payload(sentinel) + "/os-1.3.0.qcow2"
    result = run_plan(lab, host, tmp_path, plan_for(desired(url)))
    assert result.status == "successful", result.failure_messages
    assert host_root(lab, host, ["cat", f"{STANDIN}/calls"]) == f"--image {url} --version 1.3.0\n"
    assert not Path(sentinel).exists() and not host_exists(lab, host, sentinel)
    assert url not in result.all_text()  # no_log: the argv and output stay out of the artifacts


def test_annotation_payloads_are_refused_by_the_plan_and_stay_text_in_the_role(
    lab: Lab, host: Host, tmp_path: Path, sentinel: str
) -> None:
    with pytest.raises(PlanError):
        plan_for(desired(annotations={ANNOTATION: payload(sentinel)}))
    write_kubelet_credentials(lab, host, cert="cert\n")
    good = plan_for(desired(annotations={ANNOTATION: "2026-11-25T07:00:00Z"}))
    inputs = copy.deepcopy(good.inputs)
    step = inputs["kubelet_credentials"]
    key = next(iter(step["kubelet_credentials_values"]))
    step["kubelet_credentials_values"][key] = payload(sentinel)
    step["kubelet_credentials_settings"]["rotation"] = payload(sentinel)
    result = run_plan(lab, host, tmp_path, good, inputs=inputs)
    assert result.status == "successful", result.failure_messages
    record = host_root(lab, host, ["cat", "/var/lib/inplace-extension/kubelet_credentials.json"])
    assert payload(sentinel) in record.replace("\\u0027", "'")
    assert not Path(sentinel).exists() and not host_exists(lab, host, sentinel)
