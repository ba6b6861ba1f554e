"""The flavour table: what can be started on top of the core lab (``kubelab up --flavour NAME``).

A flavour is a module with ``name``, ``binaries`` (names in :data:`kubelab.build.BINARIES`) and
``start(lab)`` (apply its CRDs, start its controllers with ``lab.start_component``, wait until they
are ready); one that may be stopped on a running lab also has ``stop(lab)`` (``Lab.stop_flavour``).
The table maps names to module paths and imports a flavour only when it is used, so the core never
pays for a flavour it does not run.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

from hostlab.errors import LabError

if TYPE_CHECKING:
    from kubelab.lab import Lab


class Flavour(Protocol):
    name: str
    binaries: Sequence[str]

    def start(self, lab: Lab) -> None: ...


FLAVOURS: dict[str, str] = {
    "capi": "kubelab.flavours.capi",
    "mcm": "kubelab.flavours.mcm",
    "nodes": "kubelab.flavours.nodes",
}


def load(name: str) -> Flavour:
    if name not in FLAVOURS:
        raise LabError(f"kubelab: unknown flavour {name!r}; known: {', '.join(sorted(FLAVOURS)) or 'none'}")
    return cast("Flavour", importlib.import_module(FLAVOURS[name]))
