"""The ``kubernetes`` executor: each update attempt runs as a Kubernetes Job from the service's own image,
and the record of the attempts is an annotation on the object the update is for (a CAPI Machine; for
the MCM agent, the Node), so any replica answers any poll.

- ``record.py``: the record (pure): the attempts, their outcomes, the health-wait clock;
- ``spec.py``: what a Job is told (its Secret) and what it answers (its termination message), pure;
- ``manifest.py``: the Job and Secret manifests (pure);
- ``backend.py``: :class:`~inplace_extension.runs.backend.Backend` over the ``kube`` ports;
- ``attempt.py``: one attempt inside the Job: a batch play of one (``plays/batch.py``).
"""
