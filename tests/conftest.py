"""Shared pytest configuration: registers the host lab plugin (``lab``, ``lab_hosts``, ``lab_inventory``)."""

pytest_plugins = ["hostlab.pytest_plugin"]
