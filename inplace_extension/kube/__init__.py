"""The Kubernetes adapter: the only package that imports the Kubernetes client library (lightkube).

Its face is :mod:`~inplace_extension.kube.port` (typed ports per role a cluster plays, the values they
exchange) and :mod:`~inplace_extension.kube.errors` (its own error types); callers never see the
library's objects or exceptions. Inside, one module per kind of object: ``machines`` (CAPI Machines),
``nodes``, ``drain`` (cordon, evictions, uncordon; Pods), ``events`` (the one Event writer),
``mcm_objects`` (MCM's objects), ``workload`` (reaching a workload cluster); ``client`` connects and
turns library errors into ours; ``cluster`` puts the modules together as the ports' implementations.

Why lightkube: typed models for every core resource, generic resources for CRDs (Machines), sync and
async clients on httpx, server-side apply and watch with resourceVersion; kopf would own the process and
its event loop, which the service's edges already own.
"""
