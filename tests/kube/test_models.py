"""Two threads decoding the same lightkube model for the first time crash the process (SIGSEGV, inside
msgspec): once the adapter has made a client, or found a kind for a health check, they do not
(:mod:`inplace_extension.kube.models`).

Each case runs in a fresh interpreter (a model made ready once stays ready for the process), several
times, as the crash depends on when the interpreter switches threads. The first test is the canary: the
same first uses without the adapter crash; when it fails, msgspec no longer has the race and models.py
can go.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

RUNS = 8

# four threads, released together, each building the models the service's threads build first: a Job and
# its Secret (two Machines' attempts launched at once), a Node (records on Nodes), a Deployment (a kind a
# health check names, found at run time)
FIRST_USES = """
import sys, threading
from pathlib import Path

setup = sys.argv[1]
if setup == "adapter":
    from inplace_extension.kube.client import connect
    from inplace_extension.kube.objects import resource_of
    from inplace_extension.kube.port import ObjectQuery

    connect(Path(sys.argv[2]))
    resource_of(ObjectQuery("apps/v1", "Deployment", "default", "ceph"))

from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Secret

POD = {"spec": {"containers": [{"name": "play", "image": "i", "resources": {"requests": {"cpu": "1"}},
       "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
       "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
           "nodeSelectorTerms": [
               {"matchExpressions": [{"key": "h", "operator": "NotIn", "values": ["n"]}]}
           ]}}},
       "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}}
barrier = threading.Barrier(4)

def first_use():
    barrier.wait()
    Job.from_dict({"metadata": {"name": "j"}, "spec": {"template": POD}})
    Secret.from_dict({"metadata": {"name": "s"}, "data": {"k": "dg=="}})
    address = {"type": "InternalIP", "address": "a"}
    Node.from_dict({"metadata": {"name": "n"}, "status": {"addresses": [address]}})
    Deployment.from_dict({"metadata": {"name": "d"}, "spec": {"selector": {}, "template": POD}})

threads = [threading.Thread(target=first_use) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("decoded")
"""


def _run(setup: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", FIRST_USES, setup, str(kubeconfig)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _kubeconfig(tmp_path: Path) -> Path:
    """A client is made without connecting: the server is never called."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_without_the_adapter_first_uses_in_threads_crash_the_process(tmp_path: Path) -> None:
    codes = [_run("none", _kubeconfig(tmp_path)).returncode for _ in range(RUNS)]
    assert -11 in codes, f"no crash in {RUNS} runs ({codes}): msgspec may be fixed; see models.py"


def test_after_the_adapter_made_a_client_first_uses_in_threads_are_safe(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path)
    for _ in range(RUNS):
        done = _run("adapter", kubeconfig)
        assert (done.returncode, done.stdout.strip()) == (0, "decoded"), done.stderr[-2000:]
