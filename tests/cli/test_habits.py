"""The CLI as people use other CLIs: --no-X and --X=false for booleans, defaults, choices and variables in
--help, --version, each command with only its own flags, $KUBECONFIG, and ``call`` hints for the usual
mistakes (the wrong scheme, an untrusted certificate, an unreadable CA file)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from inplace_extension.cli import build_parser
from inplace_extension.cli.flags import settings_from_args

from .conftest import FIXTURES, Server, clean_env, run_cli

StartServer = Callable[..., Server]
DISCOVERY = str(FIXTURES / "discovery" / "request.json")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--affects-availability=false"], False),
        (["--affects-availability=False"], False),
        (["--no-affects-availability"], False),
        (["--affects-availability=true"], True),
        (["--affects-availability"], True),
        ([], True),
    ],
)
def test_every_boolean_takes_no_and_false(flags: list[str], expected: bool) -> None:
    args = build_parser().parse_args(["serve", *flags])
    assert settings_from_args(args).affects_availability is expected


def test_a_boolean_with_another_word_is_refused_by_name(tmp_path: Path) -> None:
    result = run_cli("serve", "--plain-http=maybe", env=clean_env(tmp_path))
    assert result.returncode == 2
    assert "argument --plain-http: expected true or false, got 'maybe'" in result.stderr


def test_call_and_agent_booleans_take_false_too() -> None:
    call = build_parser().parse_args(["call", "discovery", "x.json", "--insecure=false"])
    assert call.insecure is False
    agent = build_parser().parse_args(["mcm-agent", "--namespace", "n", "--delete-pods=true"])
    assert agent.delete_pods is True


def test_help_shows_types_choices_defaults_and_variables(tmp_path: Path) -> None:
    result = run_cli("serve", "--help", env=clean_env(tmp_path) | {"COLUMNS": "1000"})
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "VALUE" not in text
    assert "--drain {auto,always,never}" in text
    assert "--log-format {text,json}" in text
    assert "--listen HOST:PORT" in text
    assert "--max-parallel-runs N" in text
    assert "(default: 8; env INPLACE_MAX_PARALLEL_RUNS)" in text
    assert "--affects-availability, --no-affects-availability" in text
    # a default computed from the environment is the one this environment gets
    assert f"default: {tmp_path}/inplace-extension/runs;" in text


def test_version(tmp_path: Path) -> None:
    result = run_cli("--version", env=clean_env(tmp_path))
    assert result.returncode == 0
    assert result.stdout.strip() == "inplace-extension 0.1.0"


def test_each_command_shows_only_its_own_flags(tmp_path: Path) -> None:
    agent = run_cli("mcm-agent", "--help", env=clean_env(tmp_path)).stdout
    for own in (
        "--namespace",
        "--target-kubeconfig",
        "--inventory",
        "--allowed-cidrs",
        "--capabilities-file",
    ):
        assert own in agent, own
    for served in ("--tls-cert", "--client-ca", "--path-prefix", "--drain", "--kube ", "--self-signed"):
        assert served not in agent, served
    call = run_cli("call", "--help", env=clean_env(tmp_path)).stdout
    assert "--inventory" not in call and "--cacert" in call


def test_serve_and_the_agent_take_the_kubeconfig_from_the_environment(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config"
    env = clean_env(tmp_path) | {"KUBECONFIG": f"{missing}:{tmp_path / 'second'}"}
    serve = run_cli("serve", "--plain-http", "--listen", "127.0.0.1:0", "--kube", env=env)
    assert serve.returncode == 2
    # the start stops naming where the path came from (issue 39)
    assert f"inplace-extension: $KUBECONFIG's first file {missing}: cannot read it" in serve.stderr
    agent = run_cli("mcm-agent", "--namespace", "n", "--listen", "127.0.0.1:0", env=env)
    assert agent.returncode == 2
    assert f"inplace-extension: $KUBECONFIG's first file {missing}: cannot read it" in agent.stderr


def test_serve_warns_when_no_host_can_be_reached(start_server: StartServer) -> None:
    server = start_server("--listen", "127.0.0.1:0", "--plain-http")
    assert any("UpdateMachine cannot reach any host: no --allowed-cidrs" in line for line in server.output)


def test_call_trusts_the_local_dev_ca_without_flags(start_server: StartServer, tmp_path: Path) -> None:
    # start_server's state (and so --self-signed's default --tls-dir) is under tmp_path/"state"
    server = start_server("--listen", "127.0.0.1:0", "--self-signed")
    called = run_cli("call", "discovery", DISCOVERY, "--url", server.url, env=clean_env(tmp_path / "state"))
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["status"] == "Success"


def test_call_hints_at_the_scheme_and_the_certificate(start_server: StartServer, tmp_path: Path) -> None:
    tls = start_server("--listen", "127.0.0.1:0", "--self-signed", "--tls-dir", str(tmp_path / "tls"))
    elsewhere = clean_env(tmp_path / "other-state")  # no dev CA there
    as_http = run_cli(
        "call", "discovery", DISCOVERY, "--url", tls.url.replace("https:", "http:"), env=elsewhere
    )
    assert as_http.returncode == 2
    assert "if it serves HTTPS, use --url https://" in as_http.stderr
    untrusted = run_cli("call", "discovery", DISCOVERY, "--url", tls.url, env=elsewhere)
    assert untrusted.returncode == 2
    dev_ca = tmp_path / "other-state" / "inplace-extension" / "tls" / "ca.crt"
    advice = f"pass --cacert FILE with the CA that signed it (a local serve --self-signed writes {dev_ca}"
    assert advice + ", not found)" in untrusted.stderr
    plain = start_server("--listen", "127.0.0.1:0", "--plain-http")
    as_https = run_cli(
        "call", "discovery", DISCOVERY, "--url", plain.url.replace("http:", "https:"), env=elsewhere
    )
    assert as_https.returncode == 2
    assert "if it serves plain HTTP (--plain-http), use --url http://" in as_https.stderr


def test_call_names_the_ca_file_it_cannot_read(tmp_path: Path) -> None:
    absent = tmp_path / "absent.crt"
    result = run_cli("call", "discovery", DISCOVERY, "--cacert", str(absent), env=clean_env(tmp_path))
    assert result.returncode == 2
    assert f"--cacert {absent}: cannot read it (No such file or directory)" in result.stderr
