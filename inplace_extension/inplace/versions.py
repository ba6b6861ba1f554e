"""Kubernetes versions: semver parsing and the in-place upgrade rule.

kubeadm upgrades one minor version at a time and never downgrades, so an in-place version change is a
patch bump or the next minor of the same major. Anything else, including a version that
does not parse, is left to a rollout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

_SEMVER: Final = re.compile(
    r"^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True)
class KubeVersion:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: str = ""

    def __str__(self) -> str:
        text = f"v{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + self.build
        return text

    def precedence(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        """Semver 2.0 ordering key: a release sorts after its pre-releases; build metadata is ignored."""
        identifiers = tuple(
            (0, int(part), "") if part.isdigit() else (1, 0, part) for part in self.prerelease
        )
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, identifiers)


def parse_version(text: Any) -> KubeVersion | None:
    """``"v1.31.0"`` (the ``v`` is optional) -> KubeVersion; None for anything that is not semver."""
    if not isinstance(text, str):
        return None
    match = _SEMVER.match(text)
    if match is None:
        return None
    major, minor, patch, prerelease, build = match.groups()
    return KubeVersion(
        int(major), int(minor), int(patch), tuple(prerelease.split(".")) if prerelease else (), build or ""
    )


def upgrade_problem(current: Any, desired: Any) -> str | None:
    """Why ``current`` -> ``desired`` is not an in-place upgrade, or None. Never echoes the values."""
    old = parse_version(current)
    new = parse_version(desired)
    if old is None:
        return "the current version is not a Kubernetes version like v1.31.0"
    if new is None:
        return "the desired version is not a Kubernetes version like v1.31.0"
    if new.major != old.major:
        return "major version changes are not carried out in place"
    old_precedence, new_precedence = old.precedence(), new.precedence()
    if new_precedence < old_precedence:
        return "downgrades are not carried out in place"
    if new_precedence == old_precedence:
        return "only build metadata differs, which no upgrade step changes"
    if new.minor > old.minor + 1:
        return "minor versions can only go up by one at a time (kubeadm upgrade rule)"
    return None
