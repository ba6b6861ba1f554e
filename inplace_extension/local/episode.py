"""Episodes of a machine's desired states in the runs directory: which attempts may answer a poll.

A machine's desired state may come back: A, then B, then A again (the revert of a bad change). The
second A is a new *episode* of A: the host is at B by then, so it must play again, and nothing A's first
episode ended as (a success, a remembered task failure, a spent retry budget) answers it. An attempt
belongs to the episode it began in, and only the attempts of the machine's current episode answer.

``<runs_dir>/.machines/<namespace>.<name>.json`` (``{"ident", "episode"}``) names the machine's current
episode: written when an attempt of another ident than the one it names begins (a random episode id), and
each attempt's ``meta.json`` carries the episode it began in. The attempts of earlier episodes stay on
disk (their artifacts) and answer nothing. A machine without a note (a runs dir from before episodes) is
in the :data:`LEGACY` episode: its attempts without an episode answer until another ident begins. Plain
file reading and writing only; the ``local`` executor calls it from one process, whose registry runs at
most one attempt per machine at a time (so two ``enter`` of one machine never race).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from inplace_extension.plays.artifacts import read_json, write_json
from inplace_extension.runs.model import RunRequest

NOTES_DIR: Final = ".machines"
LEGACY: Final = ""  # the episode of attempts recorded without one (no note, no episode in meta.json)


@dataclass(frozen=True)
class Current:
    """The machine's current episode: of which desired state (``ident``), and its id."""

    ident: str
    episode: str


def note_file(runs_dir: Path, request: RunRequest) -> Path:
    # the namespace has no dots (a DNS label), so <namespace>.<name> names one machine
    return runs_dir / NOTES_DIR / f"{request.namespace}.{request.name}.json"


def current(runs_dir: Path, request: RunRequest) -> Current | None:
    """The machine's current episode as its note says; None without a (readable) note."""
    return _read(note_file(runs_dir, request))


def _read(path: Path) -> Current | None:
    data = read_json(path)
    if data is None or not isinstance(data.get("ident"), str) or not isinstance(data.get("episode"), str):
        return None
    return Current(data["ident"], data["episode"])


def machines(runs_dir: Path) -> list[tuple[str, str, Current]]:
    """Every machine with a (readable) note, as ``(namespace, name, current episode)``, by namespace
    and name: each machine an attempt of was ever recorded for (read-only: ``status``)."""
    found = []
    for path in (runs_dir / NOTES_DIR).glob("*.json"):
        namespace, _, name = path.name.removesuffix(".json").partition(".")
        now = _read(path)
        if now is not None and name:
            found.append((namespace, name, now))
    return sorted(found, key=lambda machine: (machine[0], machine[1]))


def answering(runs_dir: Path, request: RunRequest) -> str | None:
    """The episode whose attempts answer a poll of ``request``: the current one when it is of this
    desired state (:data:`LEGACY` without a note); None when the machine's current episode is of another
    desired state: no attempt answers, the next one begins a new episode."""
    now = current(runs_dir, request)
    if now is None:
        return LEGACY
    return now.episode if now.ident == request.ident else None


def enter(runs_dir: Path, request: RunRequest) -> tuple[str, str | None]:
    """The episode an attempt of ``request`` beginning now belongs to, and the ident of the episode it
    ends (None when it goes on in the current one): a new episode when the current one is of another
    desired state, written to the note before the attempt is recorded."""
    now = current(runs_dir, request)
    if now is None:
        episode, ended = LEGACY, None
    elif now.ident == request.ident:
        return now.episode, None
    else:
        episode, ended = secrets.token_hex(8), now.ident
    path = note_file(runs_dir, request)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json(path, {"ident": request.ident, "episode": episode})
    return episode, ended
