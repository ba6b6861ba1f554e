"""Exceptions of the host lab: one for "this machine cannot run a lab" and one for everything else."""

from __future__ import annotations


class LabError(RuntimeError):
    """A lab operation failed; the message says which step and why."""


class LabUnavailable(LabError):
    """This machine cannot run a lab (not root, a missing tool or kernel feature); the message says which."""


class FaultUnsupported(LabError):
    """A fault cannot be injected on this machine (e.g. the kernel has no netem qdisc)."""


class DemoError(RuntimeError):
    """The demo (``hostlab.demo``) cannot go on; the message says where and why."""
