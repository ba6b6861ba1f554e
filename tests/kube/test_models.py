"""Two threads decoding the same lightkube model for the first time must not crash the process.

lightkube's models are msgspec Structs, and msgspec before 0.23 built a Struct's decoding information on
its first use without a lock: two threads doing that at once crashed the process with SIGSEGV (with
msgspec 0.22.0 every one of 20 processes of the case below crashed here, quiet or loaded). The
service does exactly that: its worker threads share one blocking client (two Machines' Jobs launched at
once) and the MCM agent's event loop reads Nodes while its worker threads write records on them; a
replica that died that way launched nothing more and logged nothing. pyproject.toml's floor
``msgspec>=0.23`` is what keeps it away; this test fails if an install goes below it.

Each case runs in a fresh interpreter (a model decoded once stays ready for the process), several times,
with the thread switch interval at its smallest so that the threads interleave inside the first use.
"""

from __future__ import annotations

import subprocess
import sys

RUNS = 8

# four threads, released together, each building the models the service's threads build first: a Job and
# its Secret (two Machines' attempts launched at once), a Node (records on Nodes), a Deployment (a kind a
# health check names, found at run time)
FIRST_USES = """
import sys, threading

sys.setswitchinterval(1e-6)

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


def test_first_uses_of_a_model_in_threads_at_once_do_not_crash_the_process() -> None:
    argv = [sys.executable, "-c", FIRST_USES]
    for _ in range(RUNS):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout.strip()) == (0, "decoded"), (
            f"exit {done.returncode} (-11: SIGSEGV, msgspec's race: is it below 0.23?) {done.stderr[-2000:]}"
        )
