"""Shared pytest configuration: registers the host lab plugin (``lab``, ``lab_hosts``, ``lab_inventory``)
and the Kubernetes lab plugin (``kubelab``, ``kubelab_capi``, ``kubelab_mcm``)."""

pytest_plugins = ["hostlab.pytest_plugin", "kubelab.pytest_plugin"]
