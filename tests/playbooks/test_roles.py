"""Each capability role on a lab host: what lands on the host, convergence, removal, refusals.

Every test runs the real playbooks/update_machine.yml with only that role's capability. On the lab
hosts ``kubelet``, ``kubeadm``, ``kubectl`` and ``systemctl`` are STAND-INS (standins.py): the lab has
no Kubernetes packages and no systemd. Their call log shows which restarts and upgrades happened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostlab.lab import Host, Lab

from .apt_repo import StandinAptRepo
from .inputs import KEY_A, KEY_B, PASSWORD_HASH, inputs
from .support import (
    STAMP_TASK,
    STATE_DIR,
    ReleaseServer,
    RunResult,
    RunSpec,
    calls,
    host_exists,
    host_root,
    run_update,
)

pytestmark = pytest.mark.lab


def ok(result: RunResult) -> RunResult:
    assert result.status == "successful", result.failure_messages
    return result


def stat(lab: Lab, host: Host, path: str) -> str:
    """``owner:group mode`` of a path on the host."""
    return host_root(lab, host, ["stat", "-c", "%U:%G %a", path]).strip()


def shadow(lab: Lab, host: Host, user: str) -> list[str]:
    return host_root(lab, host, ["getent", "shadow", user]).strip().split(":")


# --- kubeadm_files ------------------------------------------------------------------------------


def _file(
    path: str, content: str, *, append: bool = False, owner: str = "root:root", mode: str = "0644"
) -> Any:
    return {"path": path, "content": content, "owner": owner, "permissions": mode, "append": append}


def test_kubeadm_files_write_append_converge_and_remove(lab: Lab, host: Host, tmp_path: Path) -> None:
    host_root(
        lab,
        host,
        ["sh", "-c", "mkdir -p /etc/inplace-test && printf 'distro line\\n' >/etc/inplace-test/distro.conf"],
    )
    files = [
        _file("/etc/inplace-test/a/b/whole.conf", "v1\n", mode="0640"),
        _file("/etc/inplace-test/distro.conf", "added by us", append=True),
        _file("/etc/inplace-test/alice.conf", "owned by alice\n", owner="alice:inplace-ops", mode="0600"),
    ]
    wanted = {"users": inputs("users")["users"], "kubeadm_files": {"kubeadm_files_files": files}}
    ok(run_update(RunSpec(lab, host, tmp_path, wanted)))
    assert lab.read_file(host, "/etc/inplace-test/a/b/whole.conf") == "v1\n"
    assert stat(lab, host, "/etc/inplace-test/a/b/whole.conf") == "root:root 640"
    distro = (
        "distro line\n"
        "# BEGIN inplace-extension /etc/inplace-test/distro.conf\n"
        "added by us\n"
        "# END inplace-extension /etc/inplace-test/distro.conf\n"
    )
    assert lab.read_file(host, "/etc/inplace-test/distro.conf") == distro
    # the owner can be a user the users role created earlier in the same run (fixed role order)
    assert stat(lab, host, "/etc/inplace-test/alice.conf") == "alice:inplace-ops 600"

    again = ok(run_update(RunSpec(lab, host, tmp_path, wanted)))
    assert again.changed_tasks == [STAMP_TASK]
    assert lab.read_file(host, "/etc/inplace-test/distro.conf") == distro  # appended once, not twice

    # A changed appended block is replaced where it is; a dropped whole file is deleted.
    files[1]["content"] = "changed by us\n"
    ok(run_update(RunSpec(lab, host, tmp_path, {"kubeadm_files": {"kubeadm_files_files": files[1:]}})))
    assert lab.read_file(host, "/etc/inplace-test/distro.conf") == distro.replace(
        "added by us", "changed by us"
    )
    assert not host_exists(lab, host, "/etc/inplace-test/a/b/whole.conf")

    # Nothing listed any more: our block is cut out of the distro file, our own files go.
    ok(run_update(RunSpec(lab, host, tmp_path, {"kubeadm_files": {"kubeadm_files_files": []}})))
    assert lab.read_file(host, "/etc/inplace-test/distro.conf") == "distro line\n"
    assert not host_exists(lab, host, "/etc/inplace-test/alice.conf")
    assert lab.read_file(host, f"{STATE_DIR}/kubeadm_files.json").count('"path"') == 0


@pytest.mark.parametrize(
    ("path", "index"),
    [("relative/file.conf", 1), ("/etc/../etc/shadow", 1), ("/etc/inplace-test/dir/", 1)],
)
def test_kubeadm_files_refuse_bad_paths(lab: Lab, host: Host, tmp_path: Path, path: str, index: int) -> None:
    files = [_file("/etc/inplace-test/fine.conf", "fine\n"), _file(path, "x\n")]
    result = run_update(RunSpec(lab, host, tmp_path, {"kubeadm_files": {"kubeadm_files_files": files}}))
    assert result.status == "failed"
    assert result.failed_roles == ["kubeadm_files"]
    assert (
        f"kubeadm_files_files entries {index}: path must be an absolute file path without '..'"
        in (result.failure_messages[0])
    )
    assert not host_exists(lab, host, "/etc/inplace-test/fine.conf")  # checked before anything is written


def test_kubeadm_files_refuse_unknown_owner(lab: Lab, host: Host, tmp_path: Path) -> None:
    files = [_file("/etc/inplace-test/x.conf", "x\n", owner="nosuchuser:root")]
    result = run_update(RunSpec(lab, host, tmp_path, {"kubeadm_files": {"kubeadm_files_files": files}}))
    assert result.status == "failed"
    assert "files[0].owner: owner names a user that does not exist on the host" in result.failure_messages[0]


# --- users --------------------------------------------------------------------------------------


def test_users_created_with_keys_sudo_and_password(lab: Lab, host: Host, tmp_path: Path) -> None:
    result = ok(run_update(RunSpec(lab, host, tmp_path, inputs("users"))))
    alice = host_root(lab, host, ["getent", "passwd", "alice"]).strip().split(":")
    assert (alice[4], alice[5], alice[6]) == ("Alice Example", "/home/alice", "/bin/bash")
    groups = host_root(lab, host, ["id", "-nG", "alice"]).split()
    assert {"alice", "adm", "inplace-ops"} <= set(groups)
    assert shadow(lab, host, "alice")[1] == PASSWORD_HASH  # set and not locked (lock_password: false)
    assert lab.read_file(host, "/home/alice/.ssh/authorized_keys") == f"{KEY_A}\n{KEY_B}\n"
    assert stat(lab, host, "/home/alice/.ssh/authorized_keys") == "alice:alice 600"
    assert stat(lab, host, "/home/alice/.ssh") == "alice:alice 700"
    assert lab.read_file(host, "/etc/sudoers.d/inplace-extension-alice") == "alice ALL=(ALL) NOPASSWD:ALL\n"
    assert stat(lab, host, "/etc/sudoers.d/inplace-extension-alice") == "root:root 440"
    host_root(lab, host, ["visudo", "-c"])
    assert shadow(lab, host, "bob")[1].startswith("!")  # no hash, locked as cloud-init does by default
    assert lab.read_file(host, "/home/bob/.ssh/authorized_keys") == ""
    assert not host_exists(lab, host, "/etc/sudoers.d/inplace-extension-bob")
    # the password hash never reaches logs or artifacts
    assert "SECRETHASHMARK" not in result.all_text()

    # Keys are exclusive, sudo can be taken away, and a user that leaves the spec is disabled.
    later = inputs("users")
    alice_spec = later["users"]["users_users"][0]
    alice_spec["ssh_authorized_keys"] = [KEY_B]
    del alice_spec["sudo"]
    later["users"]["users_users"] = [alice_spec]
    ok(run_update(RunSpec(lab, host, tmp_path, later)))
    assert lab.read_file(host, "/home/alice/.ssh/authorized_keys") == f"{KEY_B}\n"
    assert not host_exists(lab, host, "/etc/sudoers.d/inplace-extension-alice")
    bob = shadow(lab, host, "bob")
    assert bob[1].startswith("!")
    assert bob[7] == "1"  # account expired on day 1: no login of any kind
    assert not host_exists(lab, host, "/home/bob/.ssh/authorized_keys")

    again = ok(run_update(RunSpec(lab, host, tmp_path, later)))
    assert again.changed_tasks == [STAMP_TASK]


def test_users_that_left_the_spec_and_were_deleted_are_not_recreated(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    ok(run_update(RunSpec(lab, host, tmp_path, inputs("users"))))
    host_root(lab, host, ["userdel", "bob"])
    only_alice = inputs("users")
    del only_alice["users"]["users_users"][1]
    ok(run_update(RunSpec(lab, host, tmp_path, only_alice)))
    assert lab.exec_in(host, ["getent", "passwd", "bob"]).returncode == 2


def test_users_of_a_run_that_failed_half_way_are_still_disabled_when_they_leave(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    """dave is created, then erin's sudo rule is refused by visudo: the run fails, and the next list
    without them still disables both (the manifest recorded what the failed run created)."""
    failing = {
        "users": {
            "users_users": [
                {"name": "dave", "ssh_authorized_keys": [KEY_A]},
                {"name": "erin", "ssh_authorized_keys": [], "sudo": "ALL=(ALL"},
            ]
        }
    }
    result = run_update(RunSpec(lab, host, tmp_path, failing))
    assert (result.status, result.failed_roles) == ("failed", ["users"])
    assert "visudo refused the sudo rule" in result.failure_messages[0]
    assert lab.read_file(host, "/home/dave/.ssh/authorized_keys") == f"{KEY_A}\n"
    ok(run_update(RunSpec(lab, host, tmp_path, {"users": {"users_users": []}})))
    for name in ("dave", "erin"):
        entry = shadow(lab, host, name)
        assert entry[1].startswith("!") and entry[7] == "1", (name, entry)  # locked and expired
    assert not host_exists(lab, host, "/home/dave/.ssh/authorized_keys")


def test_users_inactive_expires_the_account(lab: Lab, host: Host, tmp_path: Path) -> None:
    spec = {"users": {"users_users": [{"name": "carol", "inactive": True, "ssh_authorized_keys": []}]}}
    ok(run_update(RunSpec(lab, host, tmp_path, spec)))
    assert shadow(lab, host, "carol")[7] == "1"
    spec["users"]["users_users"][0]["inactive"] = False
    ok(run_update(RunSpec(lab, host, tmp_path, spec)))
    assert shadow(lab, host, "carol")[7] == ""


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"name": "Bad Name"}, "users_users[0].name must match"),
        ({"name": "ok", "groups": ["good", "bad group"]}, "users_users[0].groups[1] must match"),
        ({"name": "ok", "gecos": "a:b"}, "users_users[0].gecos must not contain ':' or line breaks"),
        ({"name": "ok", "shell": "bin/sh"}, "users_users[0].shell must be an absolute path"),
        ({"name": "ok", "sudo": "ALL\nroot ALL=(ALL) ALL"}, "users_users[0].sudo must be one line"),
    ],
)
def test_users_refuse_bad_input(
    lab: Lab, host: Host, tmp_path: Path, user: dict[str, Any], message: str
) -> None:
    spec = {"users": {"users_users": [{**user, "ssh_authorized_keys": []}]}}
    result = run_update(RunSpec(lab, host, tmp_path, spec))
    assert result.status == "failed"
    assert result.failed_roles == ["users"]
    assert message in result.failure_messages[0]
    assert host_root(lab, host, ["getent", "passwd"]).count("/home/ok:") == 0


# --- ntp ----------------------------------------------------------------------------------------


def test_ntp_timesyncd_dropin_and_disable(lab: Lab, host: Host, tmp_path: Path) -> None:
    ok(run_update(RunSpec(lab, host, tmp_path, inputs("ntp"))))
    dropin = "/etc/systemd/timesyncd.conf.d/inplace-extension.conf"
    assert lab.read_file(host, dropin).splitlines()[1:] == ["[Time]", "NTP=0.pool.ntp.org 192.0.2.10"]
    assert calls(lab, host).count("systemctl restart systemd-timesyncd") == 1
    again = ok(run_update(RunSpec(lab, host, tmp_path, inputs("ntp"))))
    assert again.changed_tasks == [STAMP_TASK]
    assert calls(lab, host).count("systemctl restart systemd-timesyncd") == 1

    ok(
        run_update(
            RunSpec(lab, host, tmp_path, {"ntp": {"ntp_enabled": False, "ntp_servers": ["a.example"]}})
        )
    )
    assert not host_exists(lab, host, dropin)
    assert calls(lab, host).count("systemctl restart systemd-timesyncd") == 2


def test_ntp_uses_chrony_when_installed(lab: Lab, host: Host, tmp_path: Path) -> None:
    # STAND-IN: an empty executable where chronyd lives; the role only checks that it exists.
    host_root(
        lab,
        host,
        ["sh", "-c", "install -d /etc/chrony/sources.d && install -m 0755 /dev/null /usr/sbin/chronyd"],
    )
    ok(run_update(RunSpec(lab, host, tmp_path, inputs("ntp"))))
    sources = lab.read_file(host, "/etc/chrony/sources.d/inplace-extension.sources").splitlines()
    assert sources[1:] == ["server 0.pool.ntp.org iburst", "server 192.0.2.10 iburst"]
    assert "systemctl restart chrony" in calls(lab, host)
    assert not host_exists(lab, host, "/etc/systemd/timesyncd.conf.d/inplace-extension.conf")


def test_ntp_refuses_server_names_with_spaces(lab: Lab, host: Host, tmp_path: Path) -> None:
    spec = {"ntp": {"ntp_enabled": True, "ntp_servers": ["good.example", "bad example"]}}
    result = run_update(RunSpec(lab, host, tmp_path, spec))
    assert result.status == "failed"
    assert "every ntp_servers entry a host name or address" in result.failure_messages[0]


# --- kubelet_args -------------------------------------------------------------------------------


def test_kubelet_args_file_restart_and_health(lab: Lab, host: Host, tmp_path: Path) -> None:
    before = calls(lab, host).count("systemctl restart kubelet")
    ok(run_update(RunSpec(lab, host, tmp_path, inputs("kubelet_args"))))
    lines = lab.read_file(host, "/etc/default/kubelet").splitlines()
    assert lines[1:] == ['KUBELET_EXTRA_ARGS="--node-labels=tier=web,zone=a --max-pods=60"']
    log = calls(lab, host)
    assert log.count("systemctl restart kubelet") == before + 1
    # the restarted kubelet stand-in came up (its health server is what the role waited for)
    assert log[-1] == "kubelet@v1.30.2 --standin-daemon"
    again = ok(run_update(RunSpec(lab, host, tmp_path, inputs("kubelet_args"))))
    assert again.changed_tasks == [STAMP_TASK]
    assert calls(lab, host).count("systemctl restart kubelet") == before + 1


def test_kubelet_args_fail_when_kubelet_stays_unhealthy(lab: Lab, host: Host, tmp_path: Path) -> None:
    # the restart command "succeeds" but nothing serves healthz afterwards
    host_root(lab, host, ["sh", "-c", "kill $(cat /run/inplace-standins-kubelet.pid)"])
    extravars = {
        "kubelet_args_restart_command": ["true"],
        "kubelet_args_health_timeout_seconds": 2,
    }
    result = run_update(RunSpec(lab, host, tmp_path, inputs("kubelet_args"), extravars=extravars))
    assert result.status == "failed"
    assert result.failed_roles == ["kubelet_args"]
    assert not host_exists(lab, host, f"{STATE_DIR}/stamp.json")


# --- kubernetes_version -------------------------------------------------------------------------


def _version(target: str, control_plane: bool = False) -> dict[str, Any]:
    return {
        "kubernetes_version": {
            "kubernetes_version_target": target,
            "kubernetes_version_control_plane": control_plane,
        }
    }


def _binary_source(server: ReleaseServer) -> dict[str, Any]:
    return {
        "kubernetes_version_package_source": "binary",
        "kubernetes_version_binary_base_url": server.base_url,
    }


def test_kubernetes_version_minor_upgrade_on_a_worker(lab: Lab, host: Host, tmp_path: Path) -> None:
    with ReleaseServer(lab.gateway) as server:
        extra = _binary_source(server)
        ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.31.0"), extravars=extra)))
        assert host_root(lab, host, ["kubelet", "--version"]).strip() == "Kubernetes v1.31.0"
        assert host_root(lab, host, ["kubectl", "version", "--client"]).strip() == "Client Version: v1.31.0"
        steps = [
            line
            for line in calls(lab, host)
            if line.startswith(("kubeadm", "systemctl")) and "--version" not in line
        ]
        # kubeadm's node procedure, in order, with kubeadm already at the new version
        assert steps[-3:] == [
            "kubeadm@v1.31.0 upgrade node",
            "systemctl daemon-reload",
            "systemctl restart kubelet",
        ]
        assert "kubelet@v1.31.0 --standin-daemon" in calls(lab, host)
        assert "/v1.31.0/bin/linux/amd64/kubeadm.sha256" in server.requests

        again = ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.31.0"), extravars=extra)))
        assert again.changed_tasks == [STAMP_TASK]


def test_kubernetes_version_appends_the_extra_kubeadm_flags_as_argv_items(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    flags = ["--ignore-preflight-errors=SystemVerification", "--certificate-renewal=false"]
    with ReleaseServer(lab.gateway) as server:
        extra = {**_binary_source(server), "kubernetes_version_kubeadm_upgrade_args": flags}
        ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.31.0"), extravars=extra)))
    assert f"kubeadm@v1.31.0 upgrade node {' '.join(flags)}" in calls(lab, host)


@pytest.mark.parametrize(
    "bad",
    [
        "--ignore-preflight-errors=all",  # a string, not a list
        ["-v=5"],  # not a --flag
        ["--patches=/tmp/x\n--config=/tmp/y"],  # a control character
        [5],
    ],
)
def test_kubernetes_version_refuses_malformed_kubeadm_flags_before_any_change(
    lab: Lab, host: Host, tmp_path: Path, bad: Any
) -> None:
    extra = {"kubernetes_version_package_source": "binary", "kubernetes_version_kubeadm_upgrade_args": bad}
    result = run_update(RunSpec(lab, host, tmp_path, _version("v1.31.0"), extravars=extra))
    assert result.status == "failed"
    assert result.failed_roles == ["kubernetes_version"]
    assert not any(line.startswith("kubeadm") and "upgrade" in line for line in calls(lab, host))
    assert host_root(lab, host, ["kubelet", "--version"]).strip() == "Kubernetes v1.30.2"


def test_kubernetes_version_upgrade_from_a_signed_apt_repository(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    # Test setup, said plainly: the host's Debian sources are switched off and apt talks straight to the
    # lab gateway (not through the lab's Debian-only proxy), so only the stand-in repository is used.
    direct = f'Acquire::http::Proxy::{lab.gateway} "DIRECT";\n'
    host_root(lab, host, ["sh", "-c", "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*"])
    host_root(lab, host, ["tee", "/etc/apt/apt.conf.d/99inplace-test-direct"], stdin=direct)
    with StandinAptRepo(tmp_path, ["v1.31.0"], lab.gateway) as repo:
        extra = {
            "kubernetes_version_package_source": "apt",
            "kubernetes_version_apt_repository_base": repo.base_url,
        }
        ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.31.0"), extravars=extra)))
        assert "/core:/stable:/v1.31/deb/InRelease" in repo.requests  # apt checked the signature
        again = ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.31.0"), extravars=extra)))
        assert again.changed_tasks == [STAMP_TASK]
    assert host_root(lab, host, ["kubelet", "--version"]).strip() == "Kubernetes v1.31.0"
    installed = host_root(lab, host, ["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n"])
    for name in ("kubeadm", "kubelet", "kubectl"):
        assert f"{name} 1.31.0-1.1 hold ok installed" in installed
    assert "kubeadm@v1.31.0 upgrade node" in calls(lab, host)
    source = lab.read_file(host, "/etc/apt/sources.list.d/kubernetes.list").splitlines()[-1]
    key = "/etc/apt/keyrings/kubernetes-apt-keyring.asc"
    assert source == f"deb [signed-by={key}] {repo.base_url}/v1.31/deb/ /"


def test_kubernetes_version_first_control_plane_applies(lab: Lab, host: Host, tmp_path: Path) -> None:
    with ReleaseServer(lab.gateway) as server:
        extra = _binary_source(server)
        ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.30.5", control_plane=True), extravars=extra)))
        assert "kubeadm@v1.30.5 upgrade apply v1.30.5 --yes" in calls(lab, host)
        assert lab.read_file(host, "/var/lib/inplace-standins/cluster-version").strip() == "v1.30.5"


def test_kubernetes_version_later_control_plane_upgrades_node(lab: Lab, host: Host, tmp_path: Path) -> None:
    # the cluster-wide upgrade already happened on another control plane machine
    host_root(lab, host, ["tee", "/var/lib/inplace-standins/cluster-version"], stdin="v1.30.5\n")
    with ReleaseServer(lab.gateway) as server:
        extra = _binary_source(server)
        ok(run_update(RunSpec(lab, host, tmp_path, _version("v1.30.5", control_plane=True), extravars=extra)))
    log = calls(lab, host)
    assert "kubeadm@v1.30.5 upgrade node" in log
    assert not [line for line in log if "upgrade apply" in line]


@pytest.mark.parametrize(
    "target", ["v1.29.9", "v1.30.1", "v1.32.0", "v2.30.2"], ids=["minor-down", "patch-down", "skip", "major"]
)
def test_kubernetes_version_refuses_downgrades_and_skips(
    lab: Lab, host: Host, tmp_path: Path, target: str
) -> None:
    result = run_update(RunSpec(lab, host, tmp_path, _version(target)))
    assert result.status == "failed"
    assert result.failed_roles == ["kubernetes_version"]
    assert "refusing to change Kubernetes from v1.30.2 to the target" in result.failure_messages[0]
    assert host_root(lab, host, ["kubelet", "--version"]).strip() == "Kubernetes v1.30.2"
    assert not [line for line in calls(lab, host) if line.startswith("kubeadm")]
