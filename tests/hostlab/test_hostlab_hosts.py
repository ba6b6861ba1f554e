"""Lab hosts: SSH with pinned host keys, isolation, apt through the proxy, reset restores the host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hostlab.lab import Host, Lab

pytestmark = pytest.mark.lab


def test_each_host_answers_ssh_with_its_own_hostname(lab: Lab) -> None:
    hosts = lab.hosts()
    assert len(hosts) >= 3
    assert len({h.address for h in hosts}) == len(hosts)
    for host in hosts:
        result = lab.ssh(host, ["hostname"])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host.name


def test_login_user_is_unprivileged_with_passwordless_sudo_and_python3(lab: Lab) -> None:
    host = lab.hosts()[0]
    result = lab.ssh(
        host, ["sh", "-c", "id -un; sudo -n id -u; python3 -c 'import sys; print(sys.version_info[0])'"]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ansible", "0", "3"]


def test_host_key_verification_is_on_and_pinned(lab: Lab, tmp_path: Path) -> None:
    host = lab.hosts()[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = [a.replace(str(lab.known_hosts), str(empty)) for a in lab.ssh_argv(host)]
    refused = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr
    pinned = lab.known_hosts.read_text().splitlines()
    assert any(line.startswith(f"{host.address} ssh-ed25519 ") for line in pinned)


def test_hosts_have_no_route_out_of_the_lab(lab: Lab) -> None:
    host = lab.hosts()[0]
    routes = lab.ssh(host, ["ip", "-4", "route", "show"])
    assert routes.returncode == 0, routes.stderr
    assert routes.stdout.split("\n")[0].startswith(str(lab.network))
    assert "default" not in routes.stdout
    # 192.0.2.1 (TEST-NET-1): the kernel refuses before any packet leaves
    out = lab.ssh(host, ["ip", "route", "get", "192.0.2.1"])
    assert out.returncode != 0
    assert "unreachable" in out.stderr.lower()


def test_apt_installs_through_the_gateway_proxy(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[0]
    assert lab.ssh(host, ["sh", "-c", "command -v tree"]).returncode != 0
    install = lab.ssh(
        host,
        [
            "sudo",
            "-n",
            "sh",
            "-c",
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tree",
        ],
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert lab.ssh(host, ["tree", "--version"]).returncode == 0
    log = (lab.dir / "aptproxy.log").read_text()
    assert f"{host.address} " in log
    assert "/pool/main/t/tree/tree_" in log


def test_proxy_refuses_hosts_outside_the_allow_list(lab: Lab) -> None:
    host = lab.hosts()[0]
    script = (
        "import urllib.request, urllib.error, sys\n"
        f"proxy = urllib.request.ProxyHandler({{'http': 'http://{lab.gateway}:3142'}})\n"
        "try:\n"
        "    urllib.request.build_opener(proxy).open('http://example.com/', timeout=10)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.read().decode().strip())\n"
    )
    result = lab.ssh(host, ["python3", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "403 hostlab aptproxy: host not allowed: example.com"


def test_reset_restores_a_changed_file_and_keeps_identity(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[1]
    wrote = lab.ssh(
        host, ["sudo", "-n", "sh", "-c", "echo changed > /etc/motd && echo new > /etc/hostlab-test"]
    )
    assert wrote.returncode == 0, wrote.stderr
    assert lab.read_file(host, "/etc/motd") == "changed\n"
    before = lab.known_hosts.read_text()
    fresh = lab.reset(host.name)
    assert fresh.unshare_pid != host.unshare_pid
    assert lab.read_file(fresh, "/etc/motd") != "changed\n"
    assert lab.ssh(fresh, ["test", "-e", "/etc/hostlab-test"]).returncode == 1
    assert lab.ssh(fresh, ["hostname"]).stdout.strip() == host.name  # same key: ssh verified it
    assert lab.known_hosts.read_text() == before


def test_hosts_are_isolated_from_each_other_filesystems(lab: Lab, lab_hosts: list[Host]) -> None:
    first, second = lab_hosts[0], lab_hosts[1]
    assert lab.ssh(first, ["sudo", "-n", "touch", "/root/only-on-first"]).returncode == 0
    assert lab.ssh(first, ["sudo", "-n", "test", "-e", "/root/only-on-first"]).returncode == 0
    assert lab.ssh(second, ["sudo", "-n", "test", "-e", "/root/only-on-first"]).returncode == 1


def test_hosts_reach_the_gateway_but_not_each_other(lab: Lab) -> None:
    first, second = lab.hosts()[0], lab.hosts()[1]
    probe = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
        "    print('open')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    to_gateway = lab.ssh(first, ["python3", "-c", probe, lab.gateway, "3142"])
    assert to_gateway.stdout.strip() == "open", to_gateway.stderr
    to_peer = lab.ssh(first, ["python3", "-c", probe, second.address, "22"])
    assert to_peer.returncode == 0, to_peer.stderr
    assert to_peer.stdout.strip() in ("TimeoutError", "OSError")  # no ARP answer: never connected
