"""A lab's state file (``<run>/labs/<name>/state.json``): what runs, by which PID, on which ports.

The file is the only truth about a lab, so ``kubelab down`` from another process (or after the
process that started the lab was killed) stops exactly what was started, by PID, in reverse start
order, and a lab whose owner is gone can be reaped.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hostlab.errors import LabError
from hostlab.proc import alive, is_ours


@dataclass
class Component:
    """One process of the lab, with what proves a PID is still ours (``marker`` in its command line)."""

    name: str
    pid: int
    argv: list[str]
    marker: str
    log: str
    env: dict[str, str] = field(default_factory=dict)  # only the variables added to the lab's environment

    def running(self) -> bool:
        return is_ours(self.pid, self.marker)


@dataclass
class LabState:
    name: str
    owner_pid: int
    server: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)
    flavours: list[str] = field(default_factory=list)

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def replace(self, component: Component) -> None:
        """Record ``component`` (a restart keeps its place in the start order)."""
        for index, existing in enumerate(self.components):
            if existing.name == component.name:
                self.components[index] = component
                return
        self.components.append(component)

    def owner_alive(self) -> bool:
        # owner 0: started by hand (`kubelab up`), lives until `kubelab down`
        return self.owner_pid in (0, os.getpid()) or alive(self.owner_pid)


def state_path(lab_dir: Path) -> Path:
    return lab_dir / "state.json"


def load(lab_dir: Path) -> LabState | None:
    path = state_path(lab_dir)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LabError(f"kubelab: unreadable state file {path}: {exc}") from exc
    components = [Component(**c) for c in raw.pop("components", [])]
    return LabState(**raw, components=components)


def save(lab_dir: Path, state: LabState) -> None:
    path = state_path(lab_dir)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(state), indent=2))
    partial.replace(path)  # atomic: a reader never sees half a file


def lab_names(labs_dir: Path) -> list[str]:
    """Names of the labs that have a state file under ``labs_dir``."""
    if not labs_dir.is_dir():
        return []
    return sorted(p.name for p in labs_dir.iterdir() if state_path(p).is_file())
