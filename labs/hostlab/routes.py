"""One lab's nodes reaching another lab's hosts: the one route between two labs' networks.

Each lab is its own /24 on its own bridge, and its hosts have no default route (they address only their
/24, and their isolated bridge ports reach only the gateway). A Pod on a node of lab N that plays over
SSH to a host of lab H (a Job of the ``kubernetes`` executor on a node joined to the CAPI lab, whose
Machines are lab H's hosts) needs

- a route in each node of N to H's /24 through N's gateway (the machine routes between its bridges:
  ``net.ipv4.ip_forward`` is on wherever the labs run);
- the machine masquerading what comes from N's /24 to H's /24 behind H's gateway: H's hosts answer
  only their /24, and to them the connection looks as the service's own SSH does (from the gateway).

:func:`routed` adds both and removes both afterwards. The rule carries the comment
``hostlab:<N>-><H>``, so :func:`remove_rules` (also called by :meth:`hostlab.lab.Lab.down` of N) finds a
rule a killed session left behind.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from hostlab.errors import LabError

if TYPE_CHECKING:
    from hostlab.lab import Lab

COMMENT_PREFIX = "hostlab:"


def _comment(nodes: str, hosts: str) -> str:
    return f"{COMMENT_PREFIX}{nodes}->{hosts}"


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    iptables = shutil.which("iptables")
    if iptables is None:
        raise LabError("hostlab: routing between labs needs iptables on the machine")
    return subprocess.run([iptables, "-w", "-t", "nat", *args], capture_output=True, text=True, check=False)


def _rule(nodes: Lab, hosts: Lab) -> list[str]:
    return [
        "POSTROUTING",
        *("-s", str(nodes.network), "-d", str(hosts.network)),
        *("-m", "comment", "--comment", _comment(nodes.name, hosts.name)),
        *("-j", "MASQUERADE"),
    ]


def remove_rules(nodes_lab: str) -> None:
    """Remove every masquerading rule :func:`routed` made for lab ``nodes_lab`` (idempotent)."""
    if shutil.which("iptables") is None:
        return
    wanted = _comment(nodes_lab, "")
    for line in _iptables("-S", "POSTROUTING").stdout.splitlines():
        # -S prints the rule as it was added (the comment quoted or not): the same words after -A delete it
        words = [word.strip('"') for word in line.split()]
        if words[:2] == ["-A", "POSTROUTING"] and any(word.startswith(wanted) for word in words):
            _iptables("-D", *words[1:])


@contextmanager
def routed(nodes: Lab, hosts: Lab) -> Iterator[None]:
    """While the block runs, every node of ``nodes`` reaches the hosts of ``hosts`` (module docstring)."""
    rule = _rule(nodes, hosts)
    if _iptables("-C", *rule).returncode != 0:
        added = _iptables("-A", *rule)
        if added.returncode != 0:
            raise LabError(f"hostlab: cannot masquerade {nodes.network} to {hosts.network}: {added.stderr}")
    try:
        for node in nodes.hosts():
            argv = ["ip", "route", "replace", str(hosts.network), "via", nodes.gateway]
            result = nodes.exec_in(node, argv)
            if result.returncode != 0:
                raise LabError(f"{node.name}: {' '.join(argv)} failed: {result.stderr.strip()}")
        yield
    finally:
        for node in nodes.hosts() if nodes.exists() else []:
            if node.pid1 is not None:  # a node that is gone took its route with it
                nodes.exec_in(node, ["ip", "route", "del", str(hosts.network)])
        _iptables("-D", *rule)
