"""Faults on demand for reliability tests: each has an undo, and ``Lab.reset`` undoes them all.

- ``link(lab, host, up=False|True)``: carrier off/on on the host's bridge port (packets are dropped);
- ``sshd(lab, host, running=False|True)``: the host's PID 1 stops sshd (listener and sessions) or
  starts it again; the host itself keeps running;
- ``disk_fill`` / ``disk_free``: fill the host's writable layer (its own tmpfs) to the last byte, or free it;
- ``fail_next(lab, host, command)``: the next run of ``command`` on the host (by any user) exits 97
  with a message saying so; later runs behave normally; ``spare(lab, host, program)`` takes back a
  failure not used yet;
- ``hold_next(lab, host, command)`` / ``release(lab, host, command)``: the next run of ``command`` on
  the host waits (``held`` says it does) until released, then runs normally: a step that takes as long
  as the test needs (a kubelet that is slow to come back);
- ``slow(lab, host, delay_ms)`` / ``slow(lab, host, None)``: add latency to packets towards the host with
  tc netem; raises FaultUnsupported when the kernel has no netem qdisc.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from pathlib import Path

from hostlab.errors import FaultUnsupported, LabError
from hostlab.lab import Host, Lab, banner_ready
from hostlab.proc import run, wait_until

FILL_FILE = "var/tmp/hostlab-disk-fill"
FAIL_EXIT = 97
# a program name or an absolute path made of such names: safe to write into the wrapper script
COMMAND_RE = re.compile(r"^(/[A-Za-z0-9._+-]+)+$|^[A-Za-z0-9_+][A-Za-z0-9._+-]*$")
# the wrapper itself runs /bin/sh and /bin/rm: wrapping those would make it call itself
UNWRAPPABLE = {"sh", "dash", "rm"}
TIMEOUT = 10.0

# Installs (once) the wrapper of fault $1 around program $2 and arms it: the next run of the program, by any
# user, takes the token and runs $3 (shell code of ours) first; later runs only run the real program.
WRAP_NEXT_SCRIPT = r"""
set -eu
fault=$1 cmd=$2 once=$3
p=$(command -v -- "$cmd") || { echo "no command $cmd on this host" >&2; exit 3; }
case $p in /*) ;; *) echo "$cmd is a shell builtin or alias, not a program" >&2; exit 3 ;; esac
real="$p.hostlab-$fault"
tokens=/run/hostlab/$fault
mkdir -p "$tokens"
chmod 0777 "$tokens"    # whoever runs the command next (any user) must be able to take the token
token="$tokens/$(echo "$p" | tr / _)"
if [ ! -e "$real" ] && [ ! -L "$real" ]; then
  mv "$p" "$real"
  cat >"$p" <<EOF
#!/bin/sh
# hostlab fault "$fault" for $p: once per token in $tokens, then the real program
token="$token"
if /bin/rm "\$token" 2>/dev/null; then
$once
fi
exec "$real" "\$@"
EOF
  chmod 755 "$p"
fi
: >"$token"
echo "$p"
"""
# what a wrapper does at the run that takes its token ($token is the wrapper's own variable)
FAIL_ONCE = """\
  echo "hostlab: injected failure: this run of {command} fails once (hostlab fault fail-next)" >&2
  exit {status}"""
HOLD_ONCE = """\
  : >"$token.held"
  while [ -e "$token.held" ]; do sleep 0.1; done"""
FAIL_DIR = "run/hostlab/fail-next"  # the tokens of WRAP_NEXT_SCRIPT for the fault "fail-next"
HOLD_DIR = "run/hostlab/hold-next"  # the tokens of WRAP_NEXT_SCRIPT for the fault "hold-next"


def _running(lab: Lab, ref: Host | str | int) -> Host:
    host = ref if isinstance(ref, Host) else lab.host(ref)
    if not host.running:
        raise LabError(f"host {host.name} is not running")
    return host


def link(lab: Lab, ref: Host | str | int, *, up: bool) -> None:
    """Take the host's link down (packets to and from it are dropped) or bring it back up."""
    host = _running(lab, ref)
    run(["ip", "link", "set", host.veth, "up" if up else "down"])


def _sshd_listening(host: Host) -> bool:
    pid1 = host.pid1
    if pid1 is None:
        return False
    # /proc/PID/net/tcp{,6} show the sockets of PID's network namespace; 0A = LISTEN, 0016 = port 22
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid1}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[1].endswith(":0016") and fields[3] == "0A":
                return True
    return False


def sshd(lab: Lab, ref: Host | str | int, *, running: bool) -> None:
    """Stop sshd on the host (its PID 1 stays) or start it again; waits until the change took effect."""
    host = _running(lab, ref)
    pid1 = host.pid1
    assert pid1 is not None  # _running checked it  # noqa: S101
    os.kill(pid1, signal.SIGUSR2 if running else signal.SIGUSR1)
    state_file = host.root() / "run/hostlab/sshd.state"

    def settled() -> bool:
        try:
            state = state_file.read_text().split()
        except OSError:
            return False
        if running:
            return bool(state) and state[0] == "running" and _sshd_listening(host)
        return state == ["stopped"] and not _sshd_listening(host)

    if not wait_until(settled, TIMEOUT):
        raise LabError(f"{host.name}: sshd did not {'start' if running else 'stop'} within {TIMEOUT:g}s")
    if running and not wait_until(lambda: banner_ready(host.address), TIMEOUT) and _link_up(host):
        raise LabError(f"{host.name}: sshd listens but sends no banner within {TIMEOUT:g}s")


def _link_up(host: Host) -> bool:
    try:
        flags = int(Path(f"/sys/class/net/{host.veth}/flags").read_text(), 16)
    except OSError:
        return False
    return bool(flags & 0x1)  # IFF_UP


def disk_fill(lab: Lab, ref: Host | str | int) -> int:
    """Fill the host's writable layer until writes fail with ENOSPC; return the bytes written."""
    host = _running(lab, ref)
    target = host.root() / FILL_FILE
    written = 0
    with target.open("ab") as out:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):
            while True:
                try:
                    written += os.write(out.fileno(), chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return written


def disk_free(lab: Lab, ref: Host | str | int) -> None:
    """Remove what disk_fill wrote."""
    host = _running(lab, ref)
    (host.root() / FILL_FILE).unlink(missing_ok=True)


def _wrap_next(lab: Lab, ref: Host | str | int, fault: str, command: str, once: str) -> str:
    """The steps fail_next and hold_next share: check ``command``, wrap it on the host (once) and arm the
    wrapper so that its next run runs ``once`` first; return the program path wrapped."""
    if not COMMAND_RE.match(command):
        raise LabError(f"command must be a program name or absolute path of [A-Za-z0-9._+-], got {command!r}")
    if command.rsplit("/", 1)[-1] in UNWRAPPABLE:
        raise LabError(f"{fault} cannot wrap {command}: the fault's wrapper itself runs it")
    host = _running(lab, ref)
    result = lab.exec_in(host, ["/bin/sh", "-c", WRAP_NEXT_SCRIPT, fault, fault, command, once])
    if result.returncode != 0:
        raise LabError(f"{host.name}: {fault} {command}: {result.stderr.strip()}")
    return result.stdout.strip()


def fail_next(lab: Lab, ref: Host | str | int, command: str) -> str:
    """Make the next run of ``command`` on the host fail (exit 97); return the program path wrapped."""
    once = FAIL_ONCE.format(command=command, status=FAIL_EXIT)  # safe in a script once it matched COMMAND_RE
    return _wrap_next(lab, ref, "fail-next", command, once)


def spare(lab: Lab, ref: Host | str | int, program: str) -> bool:
    """Take back a :func:`fail_next` of ``program`` (the path it returned) that no run used yet: the next
    run works. True if one was pending (False: a run used it, or none was armed)."""
    host = _running(lab, ref)
    try:
        (host.root() / FAIL_DIR / program.replace("/", "_")).unlink()
    except FileNotFoundError:
        return False
    return True


def slow(lab: Lab, ref: Host | str | int, delay_ms: int | None) -> None:
    """Delay every packet towards the host by ``delay_ms`` (tc netem), or remove the delay (None)."""
    host = _running(lab, ref)
    if delay_ms is None:
        out = run(["tc", "qdisc", "show", "dev", host.veth])
        if "netem" in out:
            run(["tc", "qdisc", "del", "dev", host.veth, "root"])
        return
    if not 1 <= delay_ms <= 60000:
        raise LabError(f"delay must be 1..60000 ms, got {delay_ms}")
    try:
        run(["tc", "qdisc", "replace", "dev", host.veth, "root", "netem", "delay", f"{delay_ms}ms"])
    except LabError as exc:
        if "unknown" in str(exc).lower() or "not supported" in str(exc).lower():
            raise FaultUnsupported(
                "slow: this kernel has no netem qdisc (sch_netem), so link latency cannot be injected "
                f"here ({exc})"
            ) from None
        raise


def _hold_token(command: str) -> str:
    return f"{HOLD_DIR}/{command.replace('/', '_')}"


def hold_next(lab: Lab, ref: Host | str | int, command: str) -> None:
    """Make the next run of ``command`` (an absolute path) on the host wait until :func:`release`."""
    if not command.startswith("/"):
        raise LabError(f"command must be an absolute path of [A-Za-z0-9._+-], got {command!r}")
    _wrap_next(lab, ref, "hold-next", command, HOLD_ONCE)


def held(lab: Lab, ref: Host | str | int, command: str) -> bool:
    """A run of ``command`` waits on the host now (it took the token of :func:`hold_next`)."""
    host = _running(lab, ref)
    return (host.root() / f"{_hold_token(command)}.held").exists()


def release(lab: Lab, ref: Host | str | int, command: str) -> None:
    """Let a held run of ``command`` go on, and the next one run without waiting."""
    host = _running(lab, ref)
    token = host.root() / _hold_token(command)
    token.unlink(missing_ok=True)
    (token.parent / f"{token.name}.held").unlink(missing_ok=True)
