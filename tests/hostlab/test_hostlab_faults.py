"""Every fault shows its effect and its undo; a reset undoes whatever is still injected."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostlab import faults
from hostlab.errors import FaultUnsupported, LabError
from hostlab.lab import Host, Lab, banner_ready
from hostlab.proc import run, wait_until

pytestmark = pytest.mark.lab


def test_link_down_drops_traffic_and_up_restores_it(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[0]
    assert banner_ready(host.address)
    faults.link(lab, host, up=False)
    assert not banner_ready(host.address, timeout=1.0)
    assert lab.ssh(host, ["true"], connect_timeout=1).returncode == 255
    faults.link(lab, host, up=True)
    assert wait_until(lambda: banner_ready(host.address), 10)
    assert lab.ssh(host, ["hostname"]).stdout.strip() == host.name


def test_sshd_stop_refuses_connections_but_host_lives_and_start_restores(
    lab: Lab, lab_hosts: list[Host]
) -> None:
    host = lab_hosts[1]
    faults.sshd(lab, host, running=False)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host.address, 22), timeout=5).close()
    # the host itself is still up: same PID 1, and commands still run inside it
    assert host.running
    assert lab.exec_in(host, ["hostname"]).stdout.strip() == host.name
    faults.sshd(lab, host, running=True)
    assert lab.ssh(host, ["hostname"]).stdout.strip() == host.name


def test_disk_fill_makes_writes_fail_and_free_restores(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[2]
    written = faults.disk_fill(lab, host)
    assert written > 64 * 1024 * 1024  # most of the host's writable layer
    full = lab.ssh(host, ["dd", "if=/dev/zero", "of=/tmp/probe", "bs=4096", "count=1"])
    assert full.returncode != 0
    assert "No space left on device" in full.stderr
    df = lab.ssh(host, ["df", "--output=avail", "-B1", "/"]).stdout.split()
    assert df[-1] == "0"
    faults.disk_free(lab, host)
    ok = lab.ssh(host, ["sh", "-c", "echo data > /tmp/probe && cat /tmp/probe"])
    assert (ok.returncode, ok.stdout) == (0, "data\n")


def test_fail_next_fails_exactly_one_run_with_a_clear_message(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[0]
    # (not uname: PAM's motd scripts run it at every SSH login and would consume the failure)
    assert faults.fail_next(lab, host, "id") == "/usr/bin/id"
    first = lab.ssh(host, ["id", "-un"])
    assert first.returncode == faults.FAIL_EXIT
    assert "injected failure" in first.stderr
    assert "of id fails once" in first.stderr
    second = lab.ssh(host, ["id", "-un"])
    assert (second.returncode, second.stdout) == (0, "ansible\n")
    # armed again: fails once more, also when root runs it (sudo), then works
    faults.fail_next(lab, host, "id")
    assert lab.ssh(host, ["sudo", "-n", "id", "-u"]).returncode == faults.FAIL_EXIT
    assert lab.ssh(host, ["sudo", "-n", "id", "-u"]).stdout == "0\n"
    # armed, then spared before any run: the next run works, and a used or unarmed one is not pending
    program = faults.fail_next(lab, host, "id")
    assert faults.spare(lab, host, program)
    assert lab.ssh(host, ["id", "-un"]).returncode == 0
    assert not faults.spare(lab, host, program)


def test_hold_next_holds_exactly_one_run_until_released(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[0]
    faults.hold_next(lab, host, "/usr/bin/id")
    assert not faults.held(lab, host, "/usr/bin/id")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(lab.ssh, host, ["id", "-un"])
        assert wait_until(lambda: faults.held(lab, host, "/usr/bin/id"), 10)
        assert not first.done()  # it waits while held
        faults.release(lab, host, "/usr/bin/id")
        assert (first.result(10).returncode, first.result(10).stdout) == (0, "ansible\n")
    assert not faults.held(lab, host, "/usr/bin/id")
    assert lab.ssh(host, ["id", "-un"]).stdout == "ansible\n"  # the next run is not held
    with pytest.raises(LabError, match="absolute path"):
        faults.hold_next(lab, host, "id")


def test_fail_next_rejects_bad_commands_precisely(lab: Lab) -> None:
    host = lab.hosts()[0]
    with pytest.raises(LabError, match="program name or absolute path"):
        faults.fail_next(lab, host, "id; reboot")
    with pytest.raises(LabError, match="wrapper itself runs it"):
        faults.fail_next(lab, host, "sh")
    with pytest.raises(LabError, match="no command no-such-tool on this host"):
        faults.fail_next(lab, host, "no-such-tool")


def _netem_supported(host: Host) -> bool:
    try:
        run(["tc", "qdisc", "replace", "dev", host.veth, "root", "netem", "delay", "1ms"])
    except LabError:
        return False
    run(["tc", "qdisc", "del", "dev", host.veth, "root"])
    return True


def _connect_seconds(address: str) -> float:
    started = time.monotonic()
    socket.create_connection((address, 22), timeout=10).close()
    return time.monotonic() - started


def test_slow_adds_latency_or_says_clearly_that_the_kernel_cannot(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[1]
    if not _netem_supported(host):
        with pytest.raises(FaultUnsupported, match="no netem qdisc"):
            faults.slow(lab, host, 200)
        return
    assert _connect_seconds(host.address) < 0.2
    faults.slow(lab, host, 300)
    assert _connect_seconds(host.address) >= 0.3  # the SYN waits 300 ms on its way to the host
    faults.slow(lab, host, None)
    assert _connect_seconds(host.address) < 0.2


def test_slow_rejects_out_of_range_delays(lab: Lab) -> None:
    with pytest.raises(LabError, match=r"delay must be 1\.\.60000 ms"):
        faults.slow(lab, lab.hosts()[0], 0)


def test_reset_undoes_every_fault(lab: Lab, lab_hosts: list[Host]) -> None:
    host = lab_hosts[2]
    faults.fail_next(lab, host, "hostname")
    faults.disk_fill(lab, host)
    faults.sshd(lab, host, running=False)
    faults.link(lab, host, up=False)
    fresh = lab.reset(host.name)
    result = lab.ssh(fresh, ["sh", "-c", "hostname && echo x > /tmp/ok && cat /tmp/ok"])
    assert (result.returncode, result.stdout) == (0, f"{host.name}\nx\n")
