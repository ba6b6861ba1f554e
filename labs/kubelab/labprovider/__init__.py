"""The lab's infrastructure provider for real nodes: TEST INFRASTRUCTURE that stands in for a bare-metal
Cluster API infrastructure provider, modelled on k0smotron's RemoteMachine (a machine that exists already
and is reached over SSH, taken from a pool, bootstrapped by carrying out the bootstrap data over SSH, and
cleaned up and returned to the pool when its Machine goes). k0smotron's own module cannot be fetched here;
nothing of its code is used.

- :mod:`~kubelab.labprovider.crds`: LabCluster, LabMachine, LabMachineTemplate (CAPI v1beta2 contracts);
- :mod:`~kubelab.labprovider.cloudconfig`: CABPK's cloud-config read into files and scripts (pure);
- :mod:`~kubelab.labprovider.node_program` and :mod:`~kubelab.labprovider.remote`: carried out on a node
  over SSH, and the node reset;
- :mod:`~kubelab.labprovider.controller`: the controller process (``python -m kubelab.labprovider``).

:func:`start` installs the CRDs into a kubelab and starts the controller as a component of that lab (its
log ``lab-provider.log`` in the lab directory, ``lab-provider-<namespace>.log`` for one namespace's
controller; stopped by PID with the lab, or by :func:`stop`), with a pool of nodes of a hostlab lab
started with ``kind="node"``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from hostlab.lab import Lab as HostLab

from kubelab import manifests
from kubelab.lab import Lab as KubeLab
from kubelab.labprovider import crds

COMPONENT = "lab-provider"


def install_crds(kube: KubeLab) -> None:
    body = "\n---\n".join(json.dumps(crd) for crd in crds.definitions())
    kube.kubectl("apply", "--server-side", "--field-manager=kubelab", "-f", "-", input=body)
    for crd in crds.definitions():
        manifests.wait_established(kube, f"crd/{crd['metadata']['name']}")


def component(namespace: str | None = None) -> str:
    """The kubelab component name of the controller for ``namespace`` (None: every namespace)."""
    return f"{COMPONENT}-{namespace}" if namespace else COMPONENT


def start(kube: KubeLab, pool_lab: HostLab, nodes: Sequence[str], namespace: str | None = None) -> None:
    """Install the CRDs and start the controller with ``nodes`` of ``pool_lab`` as its pool; with
    ``namespace``, a controller of that namespace's objects only (one per namespace on the lab)."""
    install_crds(kube)
    name = component(namespace)
    ready = kube.dir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "kubelab.labprovider", "--kubelab", kube.name, "--hostlab", pool_lab.name]
    argv += ["--nodes", ",".join(nodes), "--ready-file", str(ready)]
    argv += ["--namespace", namespace] if namespace else []
    kube.start_component(name, argv, ready=ready.exists)


def stop(kube: KubeLab, namespace: str | None = None) -> None:
    """Stop the controller and drop it from the lab's state (a shared lab with a stopped component is
    started again by the next worker that attaches to it)."""
    kube.remove_component(component(namespace))
