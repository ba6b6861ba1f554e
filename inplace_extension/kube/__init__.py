"""The Kubernetes adapter: the only package that imports the Kubernetes client library (lightkube).

Everything above it (the MCM agent, the Kubernetes-aware CAPI mode) talks to clusters through the
functions here, so the client library can be replaced in one place and the domain code stays plain.
Why lightkube: typed models for every core resource, generic resources for CRDs (Machines), sync and
async clients on httpx (already our HTTP client), server-side apply and watch with resourceVersion;
kopf would own the process and its event loop, which the service's edges already own.
"""
