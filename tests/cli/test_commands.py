"""``plan``, ``schemas`` and the flag/env plumbing of the CLI (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inplace_extension.cli import build_parser
from inplace_extension.cli.flags import parse_listen, settings_from_args

from .conftest import FIXTURES, ROOT, clean_env, run_cli


def test_plan_explains_each_changed_field_of_a_can_update_request(tmp_path: Path) -> None:
    result = run_cli(
        "plan", str(FIXTURES / "can_update_machine" / "4B.request.json"), env=clean_env(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Machine default/my-cluster-cp-7xk2p: rollout: CAPI replaces the machines")
    assert any(
        line.split()
        == ["DockerMachine", "/customImage", "NO", "-", "no", "capability", "changes", "it", "in", "place"]
        for line in lines
    )
    assert any(line.split()[:4] == ["Machine", "/version", "yes", "kubernetes_version"] for line in lines)


def test_plan_shows_update_steps_and_fingerprint_without_values(tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "-",
        env=clean_env(tmp_path),
        stdin=(FIXTURES / "update_machine" / "6B.request.json").read_text(),
    )
    assert result.returncode == 0, result.stderr
    assert "fingerprint: " in result.stdout
    assert ["1", "kubeadm_files", "none", "unknown", "schedulable", "kubeadm_files_files"] in [
        line.split() for line in result.stdout.splitlines()
    ]
    assert "managed by cluster-api" not in result.stdout  # file content is a value: never printed
    assert "abcdef.0123456789abcdef" not in result.stdout


def test_plan_names_the_invalid_field_and_exits_1(tmp_path: Path) -> None:
    request = tmp_path / "bad.json"
    request.write_text('{"kind": "CanUpdateMachineRequest", "current": {}, "desired": {}}')
    result = run_cli("plan", str(request), env=clean_env(tmp_path))
    assert result.returncode == 1
    assert (
        "failure: InvalidRequest: current.machine: missing; current.infrastructureMachine: missing; "
        "desired.machine: missing; desired.infrastructureMachine: missing"
    ) in result.stdout


def test_schemas_check_passes_on_the_repo_and_fails_with_the_command_elsewhere(tmp_path: Path) -> None:
    assert (
        run_cli("schemas", "--check", "--write", str(ROOT / "schemas"), env=clean_env(tmp_path)).returncode
        == 0
    )
    drift = run_cli("schemas", "--check", "--write", str(tmp_path / "empty"), env=clean_env(tmp_path))
    assert drift.returncode == 1
    assert "regenerate with: python -m inplace_extension.schemas" in drift.stderr


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INPLACE_LISTEN", "127.0.0.1:1111")
    monkeypatch.setenv("INPLACE_RETRY_AFTER_SECONDS", "30")
    args = build_parser().parse_args(["serve", "--listen", "127.0.0.1:2222", "--plain-http"])
    settings = settings_from_args(args)
    assert settings.listen == "127.0.0.1:2222"
    assert settings.retry_after_seconds == 30  # from the environment
    assert settings.plain_http is True


@pytest.mark.parametrize(
    ("listen", "expected"),
    [("127.0.0.1:9443", ("127.0.0.1", 9443)), ("[::1]:0", ("::1", 0)), (":8443", ("0.0.0.0", 8443))],  # noqa: S104
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9443", "host:", "host:99999", "host:abc"])
def test_parse_listen_rejects_malformed(listen: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(listen)
