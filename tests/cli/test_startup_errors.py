"""What a newcomer's first mistakes look like (issue #30): a start-up error names the file, the flag or
the variable it came from, and the address; it comes before "serving", with exit 2 and no traceback. A
settings error says whether the value was a flag or a variable; every command's own flags have one."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inplace_extension.cli import BROKEN_PIPE_STATUS, build_parser
from inplace_extension.cli.flags import settings_from_args
from inplace_extension.engine import build_engine
from inplace_extension.tls import ensure_dev_certificate

from .conftest import FIXTURES, ROOT, clean_env, run_cli


def refused(*args: str, env: dict[str, str]) -> str:
    """Run a command that must refuse to start; its stderr, checked to be one clean message."""
    result = run_cli(*args, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "serving" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A real certificate and its key (the dev CA's serving pair)."""
    paths, _ = ensure_dev_certificate(tmp_path / "tls", ["127.0.0.1"])
    return paths.cert, paths.key


def test_a_missing_certificate_is_named_with_its_flag_and_path(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    _, key = pair
    nope = tmp_path / "nope.crt"
    serve = ("serve", "--listen", "127.0.0.1:0", "--tls-cert", str(nope), "--tls-key", str(key))
    stderr = refused(*serve, env=clean_env(tmp_path))
    assert f"inplace-extension: --tls-cert {nope}: cannot read it (No such file or directory)" in stderr


def test_a_missing_key_given_by_variable_is_named_by_the_variable(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    cert, _ = pair
    nope = tmp_path / "nope.key"
    env = clean_env(tmp_path) | {"INPLACE_TLS_CERT": str(cert), "INPLACE_TLS_KEY": str(nope)}
    stderr = refused("serve", "--listen", "127.0.0.1:0", env=env)
    assert f"inplace-extension: INPLACE_TLS_KEY={nope}: cannot read it (No such file or directory)" in stderr


def test_files_that_are_not_pem_are_named(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    cert, key = pair
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    env = clean_env(tmp_path)
    listen = ("serve", "--listen", "127.0.0.1:0")
    stderr = refused(*listen, "--tls-cert", str(junk), "--tls-key", str(key), env=env)
    assert f"--tls-cert {junk}: holds no PEM certificate" in stderr
    assert "PEM lib" not in stderr
    stderr = refused(*listen, "--tls-cert", str(cert), "--tls-key", str(junk), env=env)
    assert f"--tls-key {junk}: holds no PEM private key" in stderr
    # a key of another pair
    other, _ = ensure_dev_certificate(tmp_path / "other", ["127.0.0.1"])
    stderr = refused(*listen, "--tls-cert", str(cert), "--tls-key", str(other.key), env=env)
    assert f"--tls-key {other.key} is not the key of --tls-cert {cert}" in stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port that is in use (listened on) while the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def test_a_port_in_use_is_named_with_the_address(tmp_path: Path, taken_port: int) -> None:
    address = f"127.0.0.1:{taken_port}"
    stderr = refused("serve", "--listen", address, "--plain-http", env=clean_env(tmp_path))
    assert (
        f"inplace-extension: --listen {address}: cannot listen on {address}: Address already in use" in stderr
    )
    env = clean_env(tmp_path) | {"INPLACE_LISTEN": address}
    stderr = refused("serve", "--plain-http", env=env)
    assert f"inplace-extension: INPLACE_LISTEN={address}: cannot listen on {address}" in stderr


def test_a_port_in_use_stops_the_start_before_the_certificate_is_made_or_serving_said(
    tmp_path: Path, taken_port: int
) -> None:
    stderr = refused("serve", "--listen", f"127.0.0.1:{taken_port}", "--self-signed", env=clean_env(tmp_path))
    assert "Address already in use" in stderr


def test_a_setting_error_names_the_flag_or_the_variable(tmp_path: Path) -> None:
    by_flag = refused("serve", "--plain-http", "--drain", "sometimes", env=clean_env(tmp_path))
    assert "inplace-extension: --drain sometimes: must be one of 'auto', 'always' or 'never'" in by_flag
    by_variable = refused("serve", "--plain-http", env=clean_env(tmp_path) | {"INPLACE_DRAIN": "sometimes"})
    assert (
        "inplace-extension: INPLACE_DRAIN=sometimes: must be one of 'auto', 'always' or 'never'"
        in by_variable
    )
    pattern = refused("serve", "--plain-http", "--log-format", "yaml", env=clean_env(tmp_path))
    assert "inplace-extension: --log-format yaml: must be text or json" in pattern


@pytest.mark.parametrize(
    ("args", "variables", "expected"),
    [
        (
            ["mcm-agent", "--namespace", "m", "--resync-seconds", "often"],
            {},
            "--resync-seconds often: must be a number",
        ),
        (
            ["mcm-agent"],
            {"INPLACE_MCM_NAMESPACE": "m", "INPLACE_RESYNC_SECONDS": "often"},
            "INPLACE_RESYNC_SECONDS=often: must be a number",
        ),
        (
            ["mcm-agent"],
            {"INPLACE_MCM_NAMESPACE": "m", "INPLACE_DELETE_PODS": "maybe"},
            "INPLACE_DELETE_PODS=maybe: expected true or false",
        ),
        (["mcm-agent"], {}, "--namespace (or the variable INPLACE_MCM_NAMESPACE) is required"),
        (
            ["plan", "x.yaml"],
            {"INPLACE_PLAN_OUTPUT": "xml"},
            "INPLACE_PLAN_OUTPUT=xml: must be one of table, json, yaml",
        ),
        (
            ["call", "discovery", "x.json"],
            {"INPLACE_CALL_TIMEOUT": "soon"},
            "INPLACE_CALL_TIMEOUT=soon: must be a number",
        ),
    ],
)
def test_a_commands_own_flags_have_variables_and_errors_name_them(
    tmp_path: Path, args: list[str], variables: dict[str, str], expected: str
) -> None:
    stderr = refused(*args, env=clean_env(tmp_path) | variables)
    assert expected in stderr


def test_the_agent_reads_its_namespace_and_options_from_variables() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INPLACE_MCM_NAMESPACE", "machines")
        patch.setenv("INPLACE_DELETE_PODS", "true")
        patch.setenv("INPLACE_RESYNC_SECONDS", "7.5")
        args = build_parser().parse_args(["mcm-agent", "--resync-seconds", "9"])
    assert (args.namespace, args.delete_pods, args.resync_seconds) == ("machines", True, 9.0)  # flag wins


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path: Path) -> None:
    """``plan ... | head``: the read end is closed before plan writes, so its first write fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "inplace_extension",
                "plan",
                str(FIXTURES / "update_machine" / "6B.request.json"),
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(tmp_path),
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""  # no "[Errno 32] Broken pipe", no "Exception ignored"
    assert result.returncode == BROKEN_PIPE_STATUS


def test_plan_piped_into_head_prints_its_first_line_and_nothing_else(tmp_path: Path) -> None:
    request = FIXTURES / "update_machine" / "6B.request.json"
    result = subprocess.run(
        ["bash", "-c", f'"$0" -m inplace_extension plan {request} | head -n 1', sys.executable],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path),
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1


def test_a_misspelt_flag_gets_the_flag_it_most_likely_meant(tmp_path: Path) -> None:
    stderr = refused("serve", "--plain-http", "--drian", "never", env=clean_env(tmp_path))
    assert "unknown flag --drian (did you mean --drain?)" in stderr
    stderr = refused("mcm-agent", "--namespace", "m", "--delete-pdos", env=clean_env(tmp_path))
    assert "unknown flag --delete-pdos (did you mean --delete-pods?)" in stderr
    stderr = refused("plan", "x.yaml", "--zzz", env=clean_env(tmp_path))
    assert "unknown flag --zzz; inplace-extension plan --help lists its flags" in stderr


# -- issue 39 item 5: no setting silently ignored, every error names its origin ----------------------------


def test_a_misspelt_variable_is_refused_with_the_one_it_most_likely_meant(tmp_path: Path) -> None:
    env = clean_env(tmp_path) | {"INPLACE_MAX_PARALEL_RUNS": "3"}
    stderr = refused("serve", "--plain-http", "--listen", "127.0.0.1:0", env=env)
    assert (
        "inplace-extension: INPLACE_MAX_PARALEL_RUNS is not a variable of inplace-extension "
        "(did you mean INPLACE_MAX_PARALLEL_RUNS?)"
    ) in stderr
    stderr = refused("mcm-agent", env=clean_env(tmp_path) | {"INPLACE_MCM_NAMSPACE": "m"})
    assert (
        "INPLACE_MCM_NAMSPACE is not a variable of inplace-extension (did you mean INPLACE_MCM_NAMESPACE?)"
        in stderr
    )


def test_a_variable_the_command_does_not_use_is_warned_about_and_not_taken(tmp_path: Path) -> None:
    # mcm-agent serves plain HTTP and leaves draining to MCM: each of these is said, and none is read (a
    # bad INPLACE_DRAIN would otherwise refuse the start in the name of a setting the agent has not)
    variables = {
        "INPLACE_TLS_CERT": str(tmp_path / "tls.crt"),
        "INPLACE_BEARER_TOKEN_FILE": str(tmp_path / "token"),
        "INPLACE_DRAIN": "sometimes",
        "INPLACE_RUNS_DIR": "/proc/nope",  # the agent's own: the start stops here, after the warnings
    }
    stderr = refused(
        "mcm-agent", "--namespace", "m", "--listen", "127.0.0.1:0", env=clean_env(tmp_path) | variables
    )
    for name, flag in [
        ("INPLACE_TLS_CERT", "--tls-cert"),
        ("INPLACE_BEARER_TOKEN_FILE", "--bearer-token-file"),
        ("INPLACE_DRAIN", "--drain"),
    ]:
        assert f"inplace-extension: warning: {name} is ignored: mcm-agent has no {flag}" in stderr
    assert "sometimes" not in stderr
    assert "INPLACE_RUNS_DIR=/proc/nope: cannot create it (No such file or directory)" in stderr
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INPLACE_DRAIN", "never")
        patch.setenv("INPLACE_MAX_PARALLEL_RUNS", "3")
        args = build_parser().parse_args(["mcm-agent", "--namespace", "m"])
        settings = settings_from_args(args)
    assert (settings.drain, settings.max_parallel_runs) == ("auto", 3)  # its own setting read, no other


def test_the_path_prefix_must_start_with_a_slash(tmp_path: Path) -> None:
    stderr = refused(
        "serve", "--plain-http", "--listen", "127.0.0.1:0", "--path-prefix", "ext", env=clean_env(tmp_path)
    )
    assert (
        "inplace-extension: --path-prefix ext: must be a URL path that starts with /, e.g. /inplace" in stderr
    )


def test_the_agent_binds_first_and_names_listen_for_a_port_in_use(tmp_path: Path, taken_port: int) -> None:
    address = f"127.0.0.1:{taken_port}"
    stderr = refused("mcm-agent", "--namespace", "m", "--listen", address, env=clean_env(tmp_path))
    assert (
        f"inplace-extension: --listen {address}: cannot listen on {address}: Address already in use" in stderr
    )
    assert "uvicorn" not in stderr and "Errno" not in stderr
    env = clean_env(tmp_path) | {"INPLACE_LISTEN": address, "INPLACE_MCM_NAMESPACE": "m"}
    stderr = refused("mcm-agent", env=env)
    assert f"inplace-extension: INPLACE_LISTEN={address}: cannot listen on {address}" in stderr


SERVE = ("serve", "--plain-http", "--listen", "127.0.0.1:0")
AGENT = ("mcm-agent", "--namespace", "m", "--listen", "127.0.0.1:0")


@pytest.mark.parametrize(
    ("command", "flags", "variables", "expected"),
    [
        (SERVE, ["--runs-dir", "/proc/nope"], {}, "--runs-dir /proc/nope: cannot create it"),
        (AGENT, [], {"INPLACE_RUNS_DIR": "/proc/nope"}, "INPLACE_RUNS_DIR=/proc/nope: cannot create it"),
        (SERVE, ["--inventory", "{tmp}/nope.yaml"], {}, "--inventory {tmp}/nope.yaml: cannot read it"),
        (
            AGENT,
            [],
            {"INPLACE_INVENTORY": "{tmp}/nope.yaml"},
            "INPLACE_INVENTORY={tmp}/nope.yaml: cannot read it",
        ),
        (
            SERVE,
            [],
            {"INPLACE_CAPABILITIES_FILE": "{tmp}/caps.yaml"},
            "INPLACE_CAPABILITIES_FILE={tmp}/caps.yaml: cannot read it",
        ),
        (
            ("plan", "x.json"),
            ["--capabilities-file", "{tmp}/caps.yaml"],
            {},
            "--capabilities-file {tmp}/caps.yaml: cannot read it",
        ),
        (SERVE, ["--kubeconfig", "{tmp}/kubeconfig"], {}, "--kubeconfig {tmp}/kubeconfig: cannot read it"),
        (
            SERVE,
            ["--kube"],
            {"KUBECONFIG": "{tmp}/kubeconfig"},
            "$KUBECONFIG's first file {tmp}/kubeconfig: cannot read it",
        ),
        (
            AGENT,
            ["--target-kubeconfig", "{tmp}/kubeconfig"],
            {},
            "--target-kubeconfig {tmp}/kubeconfig: cannot read it",
        ),
        (
            AGENT,
            [],
            {"KUBECONFIG": "{tmp}/kubeconfig"},
            "$KUBECONFIG's first file {tmp}/kubeconfig: cannot read it",
        ),
        (
            AGENT,
            [],
            {"INPLACE_CONTROL_KUBECONFIG": "{tmp}/kubeconfig"},
            "INPLACE_CONTROL_KUBECONFIG={tmp}/kubeconfig: cannot read it",
        ),
    ],
)
def test_a_file_error_names_the_flag_or_variable_that_gave_the_path(
    tmp_path: Path, command: tuple[str, ...], flags: list[str], variables: dict[str, str], expected: str
) -> None:
    tmp = str(tmp_path)
    env = clean_env(tmp_path) | {name: value.format(tmp=tmp) for name, value in variables.items()}
    stderr = refused(*command, *(flag.format(tmp=tmp) for flag in flags), env=env)
    assert f"inplace-extension: {expected.format(tmp=tmp)} (No such file or directory)" in stderr


def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    broken = tmp_path / "caps.yaml"
    broken.write_text("capabilities: []\nmaintenance_windows: [\n  {name: a\nhealth_checks: []\n")
    stderr = refused(*SERVE, "--capabilities-file", str(broken), env=clean_env(tmp_path))
    assert f"inplace-extension: capabilities file {broken}: line 4, column 14: not valid YAML:" in stderr
    assert "<unicode string>" not in stderr
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  - name: a\n   address: b\n")
    stderr = refused(*SERVE, "--inventory", str(inventory), env=clean_env(tmp_path))
    assert f"inventory {inventory}: line 3, column " in stderr and "<unicode string>" not in stderr


def test_the_engine_has_no_defaulted_dependency() -> None:
    """Issue 39: mcm/main.py relied on ``cluster``'s default; every dependency is now given by each caller."""
    defaulted = [
        name
        for name, parameter in inspect.signature(build_engine).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    ]
    assert defaulted == []
