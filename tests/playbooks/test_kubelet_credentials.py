"""The shipped kubelet_credentials capability on a lab host: rotation once per annotation timestamp.

``kubelet`` and ``systemctl`` are STAND-INS (standins.py): the restart is logged in their call log and
the stand-in kubelet's health endpoint is what the role waits for. The kubeconfig and client
certificates are files written by the test, as kubeadm leaves them after join. The real kubelet's
re-bootstrap is tested on a real node: tests/nodes/test_node_capabilities.py.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from hostlab.lab import Host, Lab

from .shipped import ANNOTATION, desired, plan_for, run_plan
from .support import calls, host_exists, host_root, write_kubelet_credentials

pytestmark = pytest.mark.lab


def test_rotation_embeds_the_current_cert_in_the_bootstrap_kubeconfig_removes_the_certs_and_restarts_once(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    write_kubelet_credentials(lab, host, cert="cert\n")
    restarts = calls(lab, host).count("systemctl restart kubelet")
    plan = plan_for(desired(annotations={ANNOTATION: "2026-11-25T07:00:00Z"}))
    assert plan.capabilities == ("kubelet_credentials",)
    result = run_plan(lab, host, tmp_path, plan)
    assert result.status == "successful", result.failure_messages
    # the bootstrap kubeconfig carries the current certificate itself, not a path into the removed dir
    bootstrap = yaml.safe_load(lab.read_file(host, "/etc/kubernetes/bootstrap-kubelet.conf"))
    assert bootstrap["users"] == [
        {"name": "default-auth", "user": {"client-certificate-data": base64.b64encode(b"cert\n").decode()}}
    ]
    assert not host_exists(lab, host, "/var/lib/kubelet/pki")
    assert calls(lab, host).count("systemctl restart kubelet") == restarts + 1
    # the same timestamp in a new run (another fingerprint) does not rotate again
    again = run_plan(
        lab, host, tmp_path, plan_for(desired(annotations={ANNOTATION: "2026-11-25T07:00:00Z"}), retries=5)
    )
    assert again.status == "successful", again.failure_messages
    assert calls(lab, host).count("systemctl restart kubelet") == restarts + 1
    # a new timestamp rotates again, embedding the certificate the kubelet bootstrapped meanwhile (the
    # stand-in kubelet does not bootstrap: the test writes that certificate)
    host_root(
        lab,
        host,
        ["sh", "-c", "mkdir -p /var/lib/kubelet/pki && cat >/var/lib/kubelet/pki/kubelet-client-current.pem"],
        stdin="cert2\n",
    )
    newer = run_plan(lab, host, tmp_path, plan_for(desired(annotations={ANNOTATION: "2026-11-26T07:00:00Z"})))
    assert newer.status == "successful", newer.failure_messages
    assert calls(lab, host).count("systemctl restart kubelet") == restarts + 2
    bootstrap = yaml.safe_load(lab.read_file(host, "/etc/kubernetes/bootstrap-kubelet.conf"))
    assert bootstrap["users"][0]["user"] == {"client-certificate-data": base64.b64encode(b"cert2\n").decode()}


def test_a_kubeconfig_naming_a_missing_cert_fails_before_anything_is_removed(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    write_kubelet_credentials(lab, host, cert=None)  # no kubelet-client-current.pem
    restarts = calls(lab, host).count("systemctl restart kubelet")
    result = run_plan(
        lab, host, tmp_path, plan_for(desired(annotations={ANNOTATION: "2026-11-25T07:00:00Z"}))
    )
    assert result.status == "failed"
    assert host_exists(lab, host, "/var/lib/kubelet/pki")
    assert not host_exists(lab, host, "/etc/kubernetes/bootstrap-kubelet.conf")
    assert calls(lab, host).count("systemctl restart kubelet") == restarts
