"""What the lab provider's tests share over their pool of real nodes (hostlab.pytest_plugin.nodes_lab): the
provider running on a kubelab, LabMachines read and waited for, and whether a node is clean (nothing of a
bootstrap left on it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until
from kubelab import labprovider, objects, reads
from kubelab.lab import Lab as KubeLab
from kubelab.labprovider import crds

LAB_MACHINE = f"labmachine.{crds.GROUP}"
WAIT = 120.0  # a provisioning is a few SSH round trips; the machine's 2 cores are shared
# what tests/labprovider/cabpk.py's documents write, and CABPK's and the provider's directories
BOOTSTRAP_PATHS = (
    "/etc/lab-test/plain.conf",
    "/etc/lab-test/base64.bin",
    "/etc/lab-test/deep/gzip.txt",
    "/etc/lab-test",  # the directories the bootstrap made go too
    "/run/cluster-api",
    "/run/kubeadm",
    "/var/lib/hostlab-lab-provider",
)


@dataclass(frozen=True)
class LabMachines:
    """The LabMachines of one namespace of a kubelab."""

    kube: KubeLab
    namespace: str

    def all(self) -> list[dict[str, Any]]:
        return reads.list_objects(self.kube, LAB_MACHINE, self.namespace)

    def get(self, name: str) -> dict[str, Any]:
        found = objects.get(self.kube, LAB_MACHINE, name, self.namespace)
        assert found is not None, f"LabMachine {name} is gone"
        return found

    def wait_reason(self, name: str, reason: str, timeout: float = WAIT) -> dict[str, Any]:
        """The LabMachine once its Ready condition has ``reason``."""

        def there() -> bool:
            return ready(self.get(name)).get("reason") == reason

        assert wait_until(there, timeout, 0.5), f"LabMachine {name}: {ready(self.get(name))}, not {reason}"
        return self.get(name)


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(objects.condition(obj, "Ready") or {})


@contextmanager
def provider_running(kube: KubeLab, pool: HostLab, namespace: str) -> Iterator[LabMachines]:
    """The provider on ``kube`` with every node of ``pool``, for ``namespace`` only (other modules' providers
    may share ``kube``); at the end the namespace's LabMachines are deleted and waited for (their nodes
    reset: the finalizer needs the controller), then it is stopped."""
    labprovider.start(kube, pool, [h.name for h in pool.hosts()], namespace)
    objects.ensure_namespace(kube, namespace)
    machines = LabMachines(kube, namespace)
    try:
        yield machines
    finally:
        kube.kubectl("delete", LAB_MACHINE, "--all", "-n", namespace, "--wait=false", check=False)
        wait_until(lambda: not machines.all(), WAIT, 0.5)
        labprovider.stop(kube, namespace)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def stat(pool: HostLab, host: Host, path: str) -> str:
    """``<octal mode> <user>:<group>`` of ``path`` on the node, or ``missing``."""
    result = pool.exec_in(host, ["stat", "-c", "%a %U:%G", path])
    return result.stdout.strip() if result.returncode == 0 else "missing"


def clean(pool: HostLab, host: Host) -> bool:
    """Nothing of a bootstrap is left on the node: the documents' files, CABPK's and the provider's dirs."""
    return all(stat(pool, host, p) == "missing" for p in BOOTSTRAP_PATHS)
