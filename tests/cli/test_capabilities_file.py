"""``--capabilities-file`` at the CLI: ``plan`` judges custom claims as the service would, and ``serve``
and ``mcm-agent`` stop on a bad file with exit 2 and the loader's message as it is (the loader's own tests,
tests/test_capabilities_file.py, pin that message: its line, field and words)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_capabilities_file import CEPH_CHECK  # the loader's tests own the file's text

from inplace_extension.capabilities_file import CapabilitiesFileError, load_capabilities

from .conftest import FIXTURES, Server, clean_env, run_cli

StartServer = Callable[..., Server]

URL = "https://images.example/os-v2.qcow2"


def capabilities_file(tmp_path: Path) -> Path:
    (tmp_path / "roles" / "os_image" / "tasks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "roles" / "os_image" / "tasks" / "main.yml").write_text("---\n[]\n")
    path = tmp_path / "capabilities.yaml"
    path.write_text(
        "capabilities:\n"
        f"  - {{name: os_image, role: os_image, roles_path: {tmp_path / 'roles'},"
        " claims: [{kind: Metal3Machine, pointer: /image/url}]}\n"
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


def loader_refusal(path: Path) -> str:
    """The loader's message for a bad file: its words, line and field are pinned by the loader's tests."""
    with pytest.raises(CapabilitiesFileError) as info:
        load_capabilities(path)
    return str(info.value)


def test_serve_and_mcm_agent_stop_on_a_bad_file_with_exit_2_and_the_loaders_message(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(CEPH_CHECK.replace("==", "=", 1))  # not a CEL expression: compiled before the start
    expected = f"inplace-extension: {loader_refusal(caps)}"
    serve = ["serve", "--plain-http", "--listen", "127.0.0.1:0", "--capabilities-file", str(caps)]
    # port 0: the agent binds its address first (issue 39), and 9443 may be in use on this machine
    agent = [
        "mcm-agent",
        "--namespace",
        "machines",
        "--listen",
        "127.0.0.1:0",
        "--capabilities-file",
        str(caps),
    ]
    for argv in (serve, agent):
        result = run_cli(*argv, env=clean_env(tmp_path))
        assert (result.returncode, result.stderr.strip()) == (2, expected), argv
        assert "serving" not in result.stdout


def test_serve_refuses_kubernetes_checks_without_the_kubernetes_aware_mode(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(CEPH_CHECK)
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


NODE_EXPORTER = "health_checks:\n  - {name: node_exporter, url: 'http://{address}:9100/metrics'}\n"


def url_check_refusal(caps: Path, mode: str) -> str:
    return (
        f'inplace-extension: capabilities file {caps}: the url health check "node_exporter" is asked only '
        "by the health gate of serve's Kubernetes-aware mode (--kube or --kubeconfig): "
        f"{mode} would never ask it"
    )


def test_plain_serve_refuses_url_checks_naming_the_check_and_the_mode(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(NODE_EXPORTER)
    serve = ["serve", "--plain-http", "--listen", "127.0.0.1:0", "--capabilities-file", str(caps)]
    result = run_cli(*serve, env=clean_env(tmp_path))
    assert result.returncode == 2 and "serving" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == url_check_refusal(
        caps, "serve without --kube or --kubeconfig"
    )


def test_mcm_agent_refuses_url_checks_naming_the_check_and_the_mode(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(NODE_EXPORTER)
    # port 0: the agent binds its address first (issue 39), and 9443 may be in use on this machine
    agent = [
        "mcm-agent",
        "--namespace",
        "machines",
        "--listen",
        "127.0.0.1:0",
        "--capabilities-file",
        str(caps),
    ]
    result = run_cli(*agent, env=clean_env(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == url_check_refusal(caps, "mcm-agent")


def test_kubernetes_aware_serve_takes_url_checks(tmp_path: Path, start_server: StartServer) -> None:
    """The mode whose health gate asks them starts with them (the kubeconfig names an API server that
    is never called before a hook asks: starting reads the file only)."""
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(NODE_EXPORTER)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: lab\n"
        "clusters: [{name: lab, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: lab, user: {token: t}}]\n"
        "contexts: [{name: lab, context: {cluster: lab, user: lab}}]\n"
    )
    flags = ["--plain-http", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)]
    server = start_server(*flags, "--capabilities-file", str(caps))
    assert server.url.startswith("http://127.0.0.1:")
    assert not any("url health check" in line for line in server.output)
