"""The Dockerfile, without a container engine: hadolint, then its stages, user, entry point, paths and
HEALTHCHECK checked against the code (console script, Settings, the app's routes)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trustme

from inplace_extension.app import create_app
from inplace_extension.cli import build_parser, serve
from inplace_extension.cli.flags import settings_from_args
from inplace_extension.settings import Settings

from .support import DOCKERFILE, ROOT, Stage, dockerfile_stages, exec_form, parse_dockerfile, serve_tls, tool

HEALTHCHECK_URL = re.compile(r"https://127\.0\.0\.1:(?P<port>\d+)(?P<path>/[a-z]+)")


def _final() -> Stage:
    return dockerfile_stages()[-1]


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _healthcheck() -> tuple[list[str], re.Match[str]]:
    args = _final().last("HEALTHCHECK").args
    command = exec_form(args[args.index("CMD") + len("CMD") :].strip())
    match = HEALTHCHECK_URL.search(command[-1])
    assert match, f"no https://127.0.0.1:<port>/<path> in HEALTHCHECK {command}"
    return command, match


def test_hadolint_finds_nothing() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_really_linting(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\nCMD python app.py\n")
    result = _hadolint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


def test_multi_stage_on_slim_debian_python_matching_requires_python() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    minimum = re.fullmatch(r">=(\d+\.\d+)", project["requires-python"])
    assert minimum
    for stage in stages:
        assert re.fullmatch(rf"python:{re.escape(minimum.group(1))}-slim-(bookworm|trixie)", stage.base)
    build = stages[0].alias
    assert build
    assert any(f"--from={build}" in c.args for c in _final().all("COPY"))
    # the final stage installs nothing with pip: the virtualenv comes ready from the build stage
    assert not any("pip install" in r.args for r in _final().all("RUN"))


def test_runtime_has_ssh_client_and_the_ansible_stack() -> None:
    installs = " ".join(r.args for r in _final().all("RUN"))
    assert "openssh-client" in installs
    assert "--no-install-recommends" in installs
    assert "rm -rf /var/lib/apt/lists/*" in installs
    # ansible-core and ansible-runner arrive as dependencies of the project installed in the build stage
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "dependencies"
    ]
    names = {re.split(r"[<>=!~ \[]", d)[0] for d in dependencies}
    assert {"ansible-core", "ansible-runner"} <= names
    assert any(
        c.args.split()[:2] == ["pyproject.toml", "README.md"] for c in dockerfile_stages()[0].all("COPY")
    )


def test_runs_as_the_non_root_user_it_creates() -> None:
    user = _final().last("USER").args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0 and int(gid) != 0
    created = " ".join(r.args for r in _final().all("RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    # USER is set after every RUN, so nothing after it runs as root
    keywords = [i.keyword for i in _final().instructions]
    assert "RUN" not in keywords[keywords.index("USER") :]


def test_entrypoint_is_the_console_script_and_cmd_is_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    entrypoint = exec_form(_final().last("ENTRYPOINT").args)
    assert len(entrypoint) == 1
    assert scripts[entrypoint[0]] == "inplace_extension.cli:main"
    cmd = exec_form(_final().last("CMD").args)
    args = build_parser().parse_args(cmd)
    assert args.command == "serve"
    assert args.func is serve.run
    # the image configures serve through INPLACE_* variables; each one reaches the Settings it names
    env = _final().env()
    for key, value in env.items():
        if key.startswith("INPLACE_"):
            monkeypatch.setenv(key, value)
    settings = settings_from_args(build_parser().parse_args(cmd))  # the command reads its variables
    for key, value in env.items():
        if key.startswith("INPLACE_"):
            field = key.removeprefix("INPLACE_").lower()
            assert field in Settings.model_fields, key
            assert str(getattr(settings, field)) == value, key


def test_playbooks_and_schemas_are_copied_where_the_settings_point() -> None:
    copies = {c.args.split()[0]: c.args.split()[1] for c in _final().all("COPY") if "--from" not in c.args}
    assert copies["playbooks/"].rstrip("/") == _final().env()["INPLACE_PLAYBOOKS_DIR"]
    assert "schemas/" in copies
    for source in copies:
        assert (ROOT / source).is_dir(), source
    # the build context lets in exactly what is copied
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*"
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = {s.rstrip("/") for s in copies} | {
        w.rstrip("/") for c in dockerfile_stages()[0].all("COPY") for w in c.args.split()[:-1]
    }
    assert sources == included


def test_healthcheck_targets_the_served_port_and_a_route_of_the_app() -> None:
    command, match = _healthcheck()
    assert command[0] == "python"
    listen_port = _final().env()["INPLACE_LISTEN"].rpartition(":")[2]
    assert match["port"] == listen_port
    assert _final().last("EXPOSE").args == listen_port
    paths = {getattr(route, "path", None) for route in create_app(Settings(plain_http=True)).routes}
    assert match["path"] in paths


@pytest.mark.parametrize(("path", "healthy"), [(None, True), ("/nothere", False)])
def test_healthcheck_command_passes_against_the_real_app_and_fails_otherwise(
    tmp_path: Path, path: str | None, healthy: bool
) -> None:
    command, match = _healthcheck()
    ca = trustme.CA()
    cert = ca.issue_cert("inplace-extension.inplace-extension-system.svc")  # not 127.0.0.1, as in the cluster
    certfile, keyfile = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    with serve_tls(create_app(Settings(tls_cert=certfile, tls_key=keyfile)), certfile, keyfile) as port:
        code = command[-1].replace(match[0], f"https://127.0.0.1:{port}{path or match['path']}")
        result = subprocess.run(
            [sys.executable, *command[1:-1], code], capture_output=True, timeout=30, check=False
        )
    assert (result.returncode == 0) == healthy, result.stderr


def test_parser_handles_continuations_comments_and_stages() -> None:
    stages = parse_dockerfile(
        "# syntax=docker/dockerfile:1\nFROM a:1 AS one\nENV A=1 \\\n    # note\n    B=2\nFROM b:2\nUSER 1:1\n"
    )
    assert [(s.base, s.alias) for s in stages] == [("a:1", "one"), ("b:2", None)]
    assert stages[0].env() == {"A": "1", "B": "2"}
    assert stages[1].last("USER").args == "1:1"
    with_arg = parse_dockerfile("ARG BASE=c:3\nFROM ${BASE} AS one\nFROM $BASE\n")
    assert [s.base for s in with_arg] == ["c:3", "c:3"]
    with pytest.raises(AssertionError, match="OTHER"):
        parse_dockerfile("ARG BASE=c:3\nFROM ${OTHER}\n")


def test_both_stages_start_from_one_base_image_argument() -> None:
    # the image tests (test_image.py) build on a local base through this argument
    text = DOCKERFILE.read_text(encoding="utf-8")
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert froms and all(f == "${BASE_IMAGE}" for f in froms)
