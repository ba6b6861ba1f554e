"""``--capabilities-file`` at the CLI: ``plan`` judges custom claims as the service would, and ``serve``
refuses to start on a bad file with the loader's precise message."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import FIXTURES, clean_env, run_cli

URL = "https://images.example/os-v2.qcow2"


def capabilities_file(tmp_path: Path, pointer: str = "/image/url") -> Path:
    (tmp_path / "roles" / "os_image" / "tasks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "roles" / "os_image" / "tasks" / "main.yml").write_text("---\n[]\n")
    path = tmp_path / "capabilities.yaml"
    path.write_text(
        "capabilities:\n"
        f"  - {{name: os_image, role: os_image, roles_path: {tmp_path / 'roles'},"
        f" claims: [{{kind: Metal3Machine, pointer: {pointer}}}]}}\n"
    )
    return path


def update_request(tmp_path: Path) -> Path:
    request = json.loads((FIXTURES / "update_machine" / "6B.request.json").read_text())
    infra = request["desired"]["infrastructureMachine"]
    infra["kind"] = "Metal3Machine"
    infra["spec"] = {"image": {"url": URL}}
    path = tmp_path / "update.json"
    path.write_text(json.dumps(request))
    return path


def test_plan_shows_custom_steps_with_the_flag(tmp_path: Path) -> None:
    request = update_request(tmp_path)
    caps = capabilities_file(tmp_path)
    result = run_cli("plan", str(request), "--capabilities-file", str(caps), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    step = ["4", "os_image", "reboot", "unknown", "schedulable", "os_image_values"]
    assert step in [line.split() for line in result.stdout.splitlines()]
    assert URL not in result.stdout  # values are never printed
    without = run_cli("plan", str(request), env=clean_env(tmp_path))
    assert "os_image" not in without.stdout


def test_plan_reads_the_file_from_the_environment_too(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path), "INPLACE_CAPABILITIES_FILE": str(capabilities_file(tmp_path))}
    result = run_cli("plan", str(update_request(tmp_path)), env=env)
    assert result.returncode == 0, result.stderr
    assert " os_image " in result.stdout


def test_serve_refuses_a_bad_capabilities_file(tmp_path: Path) -> None:
    caps = capabilities_file(tmp_path, pointer="/ntp")
    caps.write_text(caps.read_text().replace("Metal3Machine", "KubeadmConfig"))
    result = run_cli(
        "serve",
        "--plain-http",
        "--listen",
        "127.0.0.1:0",
        "--capabilities-file",
        str(caps),
        env=clean_env(tmp_path),
    )
    assert result.returncode == 2
    assert "serving" not in result.stdout
    assert result.stderr.strip() == (
        f"inplace-extension: capabilities file {caps}: line 2: capabilities[0].claims[0].pointer: "
        "KubeadmConfig /ntp overlaps /ntp, claimed by built-in"
    )


CEPH_CHECK = (
    "health_checks:\n"
    "  - name: ceph\n"
    "    kubernetes:\n"
    "      api_version: ceph.rook.io/v1\n"
    "      kind: CephCluster\n"
    "      namespace: rook-ceph\n"
    "      name: ceph\n"
    "      expression: {expression}\n"
)


def test_serve_and_mcm_agent_refuse_a_bad_cel_expression_with_line_and_field(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(CEPH_CHECK.format(expression="object.status.health = 1"))
    expected = (
        f"inplace-extension: capabilities file {caps}: line 8: health_checks[0].kubernetes.expression: "
        "Value error, not a CEL expression: syntax error at column 22"
    )
    serve = ["serve", "--plain-http", "--listen", "127.0.0.1:0", "--capabilities-file", str(caps)]
    agent = ["mcm-agent", "--namespace", "machines", "--capabilities-file", str(caps)]
    for argv in (serve, agent):
        result = run_cli(*argv, env=clean_env(tmp_path))
        assert (result.returncode, result.stderr.strip()) == (2, expected), argv


def test_serve_refuses_kubernetes_checks_without_the_kubernetes_aware_mode(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(CEPH_CHECK.format(expression="object.status.health == 'HEALTH_OK'"))
    result = run_cli(
        "serve",
        "--plain-http",
        "--listen",
        "127.0.0.1:0",
        "--capabilities-file",
        str(caps),
        env=clean_env(tmp_path),
    )
    assert result.returncode == 2 and "serving" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        f'inplace-extension: capabilities file {caps}: the kubernetes health check "ceph" reads the cluster: '
        "it needs the Kubernetes-aware mode (--kube or --kubeconfig)"
    )
