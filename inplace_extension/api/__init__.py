"""CAPI Runtime SDK wire models for ``hooks.runtime.cluster.x-k8s.io/v1alpha1`` (pydantic v2).

Modules are named after CAPI's Go files: ``common.py`` (common_types.go), ``discovery.py``
(discovery_types.go), ``inplace.py`` (inplaceupdate_types.go); ``body.py`` turns request bytes into
these models. No logic beyond encoding lives here.
"""
