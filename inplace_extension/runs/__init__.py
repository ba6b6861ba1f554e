"""Runs: everything that touches hosts: ansible-runner, run registry and queue, artifacts, host resolution.

The only package that imports ``ansible_runner``. It knows nothing of CAPI wire models: the hooks layer
hands it a :class:`inplace_extension.runs.model.RunRequest` and gets a
:class:`inplace_extension.runs.model.Progress` back.
"""
