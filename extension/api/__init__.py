"""CAPI Runtime SDK wire models for ``hooks.runtime.cluster.x-k8s.io/v1alpha1`` (pydantic v2)."""
