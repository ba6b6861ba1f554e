"""Request data stays data: payloads in every role input never run, on the controller or the host.

Each payload would create a sentinel file if it were ever evaluated: as a Jinja template on the
controller (``lookup('pipe', ...)``) or by a shell on the host (``$(...)``, backticks). Inputs that
are written to the host must land there as the literal text; inputs the roles check (names, servers,
versions, owners) must be refused with a clear failure. The control test at the end proves that the
sentinel check does see an evaluated payload: the same string passed as a plain extra var runs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
from hostlab.lab import Host, Lab

from .standins import install_standins, lab_run_on_host
from .support import RunSpec, base_envvars, host_exists, host_root, run_update


def payloads(sentinel: str) -> dict[str, str]:
    return {
        "jinja": f"{{{{ lookup('pipe', 'touch {sentinel}') }}}}",
        "shell": f"$(touch {sentinel})",
        "backtick": f"`touch {sentinel}`",
        # no spaces, quotes of the shell kind or '$': passes the kubelet flag value check
        "jinja_compact": f"{{{{lookup('pipe','touch%c{sentinel}'|format(32))}}}}",
        # no commas or colons: passes visudo's command-argument syntax
        "jinja_no_comma": f"{{{{ lookup(*(['pipe'] + ['touch {sentinel}'])) }}}}",
    }


def assert_no_sentinel(lab: Lab, host: Host, sentinel: str) -> None:
    assert not Path(sentinel).exists(), "a payload ran on the controller"
    assert not host_exists(lab, host, sentinel), "a payload ran on the host"


@pytest.mark.lab
def test_payloads_land_as_literal_text(
    lab: Lab, lab_hosts: list[Host], tmp_path: Path, sentinel: str
) -> None:
    host = lab_hosts[0]
    install_standins(lab_run_on_host(lab, host))
    p = payloads(sentinel)
    everything = " ".join(p.values())
    file_path = f"/etc/inplace-inj/{p['jinja']}{p['shell']}{p['backtick']}.conf"
    inputs: dict[str, Any] = {
        "users": {
            "users_users": [
                {
                    "name": "mallory",
                    "gecos": f"{p['jinja']} {p['shell']} {p['backtick']}",
                    "passwd": f"{p['shell']}{p['jinja']}-PASSWDMARK",
                    "sudo": f"ALL=(ALL) NOPASSWD: /usr/bin/true {p['jinja_no_comma']} {p['shell']} "
                    f"{p['backtick']}",
                    "ssh_authorized_keys": [f"ssh-ed25519 AAAA {v}" for v in p.values()],
                }
            ]
        },
        "kubeadm_files": {
            "kubeadm_files_files": [
                {
                    "path": file_path,
                    "content": everything,
                    "owner": "root:root",
                    "permissions": "0644",
                    "append": False,
                },
                {"path": "/etc/inplace-inj/appended.conf", "content": everything, "append": True},
            ]
        },
        "kubelet_args": {"kubelet_args_extra_args": [{"name": "node-labels", "value": p["jinja_compact"]}]},
    }
    result = run_update(RunSpec(lab, host, tmp_path, inputs))
    assert result.status == "successful", result.failure_messages
    assert_no_sentinel(lab, host, sentinel)

    assert lab.read_file(host, file_path) == everything
    assert f"\n{everything}\n" in lab.read_file(host, "/etc/inplace-inj/appended.conf")
    passwd = host_root(lab, host, ["getent", "passwd", "mallory"]).rstrip("\n").split(":")
    assert passwd[4] == inputs["users"]["users_users"][0]["gecos"]
    # stored as given, behind the '!' of the default password lock (cloud-init's lock_passwd default)
    assert (
        host_root(lab, host, ["getent", "shadow", "mallory"]).split(":")[1]
        == f"!{p['shell']}{p['jinja']}-PASSWDMARK"
    )
    sudo = inputs["users"]["users_users"][0]["sudo"]
    assert lab.read_file(host, "/etc/sudoers.d/inplace-extension-mallory") == f"mallory {sudo}\n"
    keys = lab.read_file(host, "/home/mallory/.ssh/authorized_keys").splitlines()
    assert keys == inputs["users"]["users_users"][0]["ssh_authorized_keys"]
    kubelet = lab.read_file(host, "/etc/default/kubelet").splitlines()[-1]
    assert kubelet == f'KUBELET_EXTRA_ARGS="--node-labels={p["jinja_compact"]}"'
    # the password "hash" and file content are secrets: no trace in events, stdout or env files
    artifacts = result.all_text()
    assert "PASSWDMARK" not in artifacts
    assert everything not in artifacts


def _base() -> dict[str, Any]:
    return {
        "users": {"users_users": [{"name": "ok", "ssh_authorized_keys": []}]},
        "ntp": {"ntp_enabled": True, "ntp_servers": ["0.pool.ntp.org"]},
        "kubeadm_files": {"kubeadm_files_files": [{"path": "/etc/inplace-inj/x", "content": "x"}]},
        "kubelet_args": {"kubelet_args_extra_args": [{"name": "v", "value": "2"}]},
        "kubernetes_version": {
            "kubernetes_version_target": "v1.30.2",
            "kubernetes_version_control_plane": False,
        },
    }


# (capability, where the payload goes, payload kind) for every input the roles check before use
REFUSED = [
    ("users", ("users_users", 0, "name"), "jinja"),
    ("users", ("users_users", 0, "name"), "shell"),
    ("users", ("users_users", 0, "groups"), "jinja"),
    ("users", ("users_users", 0, "primary_group"), "shell"),
    ("ntp", ("ntp_servers", 0), "jinja"),
    ("ntp", ("ntp_servers", 0), "backtick"),
    ("kubeadm_files", ("kubeadm_files_files", 0, "owner"), "jinja"),
    ("kubeadm_files", ("kubeadm_files_files", 0, "permissions"), "shell"),
    ("kubelet_args", ("kubelet_args_extra_args", 0, "name"), "jinja"),
    ("kubelet_args", ("kubelet_args_extra_args", 0, "value"), "shell"),
    ("kubelet_args", ("kubelet_args_extra_args", 0, "value"), "backtick"),
    ("kubernetes_version", ("kubernetes_version_target",), "jinja"),
    ("kubernetes_version", ("kubernetes_version_target",), "shell"),
]


@pytest.mark.lab
@pytest.mark.parametrize(
    ("capability", "where", "kind"), REFUSED, ids=[f"{c}-{w[-1]}-{k}" for c, w, k in REFUSED]
)
def test_payloads_in_checked_inputs_are_refused(
    lab: Lab,
    lab_hosts: list[Host],
    tmp_path: Path,
    sentinel: str,
    capability: str,
    where: tuple[str | int, ...],
    kind: str,
) -> None:
    host = lab_hosts[0]
    install_standins(lab_run_on_host(lab, host))
    inputs = {capability: copy.deepcopy(_base()[capability])}
    target: Any = inputs[capability]
    for key in where[:-1]:
        target = target[key]
    value = payloads(sentinel)[kind]
    target[where[-1]] = [value] if where[-1] == "groups" else value
    result = run_update(RunSpec(lab, host, tmp_path, inputs))
    assert result.status == "failed"
    assert result.failed_roles == [capability]
    assert result.failure_messages[0], "a refusal must say why"
    assert_no_sentinel(lab, host, sentinel)


def test_control_a_templated_extra_var_does_run(tmp_path: Path, sentinel: str) -> None:
    """The check above can fail: the same payload as a plain extra var is executed."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.copy": {"content": "{{ payload }}", "dest": str(tmp_path / "out")}}],
        }
    ]
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path),
        playbook=play,
        inventory="localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3",
        extravars={"payload": payloads(sentinel)["jinja"]},
        envvars=base_envvars(tmp_path),
        quiet=True,
        suppress_env_files=True,
        cancel_callback=lambda: False,
    )
    assert runner.status == "successful"
    assert Path(sentinel).exists()
