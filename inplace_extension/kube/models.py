"""The lightkube models this process decodes, each made ready once before two threads can decode it.

lightkube's models are msgspec Structs, and msgspec builds a Struct's decoding information on its first
use without a lock (it runs Python code to read the annotations, so the interpreter can switch threads
half-way): two threads decoding or building the same model for the first time at the same moment
crash the process with SIGSEGV. Measured here with lightkube 1.0.1 and msgspec 0.19.0 to 0.22.0: two
threads each building their first Job crashed every one of 40 processes, two building a Secret 5 of 20.
The service does exactly that: its worker threads share one blocking client (two Machines' Jobs launched
at once), and the MCM agent's event loop reads Nodes while its worker threads write records on them. A
replica that died that way launched nothing more and logged nothing.

So every model is made ready under one lock before any client can use it: the kinds this adapter names
(:data:`KNOWN`) when the first client is made, a kind found at run time (a health check's or a Kubernetes
object's kind) as :func:`inplace_extension.kube.objects.resource_of` finds it. Making a model ready
builds its decoding information and that of every model it contains (a Job's Pod template, containers,
...); a model whose required fields an empty object lacks is ready all the same, as the information is
built before the values are checked. Generic resources (CRDs) are plain dicts and need nothing. A list's
own small model (``items`` and ``metadata``) is made by lightkube on the first list of a kind; its items'
model is what takes the time, and that is ready before.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Final

from lightkube.models.meta_v1 import DeleteOptions, LabelSelector, ObjectMeta, Status
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Node, Pod, Secret
from lightkube.resources.policy_v1 import PodDisruptionBudget

# every model the adapter's modules decode or build, and the Status every error answer is decoded into
KNOWN: Final[tuple[Any, ...]] = (
    Job,
    Pod,
    Pod.Eviction,
    Secret,
    Node,
    Node.Status,
    Event,
    PodDisruptionBudget,
    Status,
    DeleteOptions,
    LabelSelector,
    ObjectMeta,
)

_lock = threading.Lock()
_ready: set[Any] = set()


def make_ready(*models: Any) -> None:
    """Build the decoding information of each of ``models`` not ready yet, one thread at a time."""
    with _lock:
        for model in models:
            if model in _ready:
                continue
            from_dict = getattr(model, "from_dict", None)
            if from_dict is not None and not issubclass(model, dict):  # a Struct, not a generic resource
                # an empty object may lack required fields: the information is built before that is found
                with contextlib.suppress(Exception):
                    from_dict({})
            _ready.add(model)
