"""Kubernetes version parsing and the in-place upgrade rule."""

from __future__ import annotations

from typing import Any

import pytest

from inplace_extension.inplace.versions import KubeVersion, parse_version, upgrade_problem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v1.31.0", KubeVersion(1, 31, 0)),
        ("1.31.2", KubeVersion(1, 31, 2)),
        ("v1.31.0-rc.1", KubeVersion(1, 31, 0, ("rc", "1"))),
        ("v1.31.0+k3s1", KubeVersion(1, 31, 0, (), "k3s1")),
    ],
)
def test_parse_version_accepts_semver(text: str, expected: KubeVersion) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    "text", ["", "v1.31", "v01.31.0", "v1.31.0-", "latest", "v1.31.0-01", " v1.31.0", None, 131]
)
def test_parse_version_rejects_anything_else(text: Any) -> None:
    assert parse_version(text) is None


def test_version_renders_canonically_with_a_v() -> None:
    assert str(parse_version("1.31.0-rc.1+build.5")) == "v1.31.0-rc.1+build.5"


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("v1.31.0-alpha", "v1.31.0-alpha.1"),
        ("v1.31.0-alpha.1", "v1.31.0-beta"),
        ("v1.31.0-rc.2", "v1.31.0-rc.10"),
        ("v1.31.0-rc.1", "v1.31.0"),
    ],
)
def test_precedence_follows_semver_for_prereleases(lower: str, higher: str) -> None:
    low, high = parse_version(lower), parse_version(higher)
    assert low is not None and high is not None
    assert low.precedence() < high.precedence()


@pytest.mark.parametrize(
    ("old", "new"), [("v1.30.0", "v1.30.1"), ("v1.30.5", "v1.31.0"), ("v1.30.5", "v1.31.7")]
)
def test_upgrade_problem_is_none_for_patch_bumps_and_next_minor(old: str, new: str) -> None:
    assert upgrade_problem(old, new) is None


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("v1.30.1", "v1.30.0", "downgrades"),
        ("v1.31.0", "v1.30.9", "downgrades"),
        ("v1.30.0", "v1.32.0", "one at a time"),
        ("v1.30.0", "v2.30.0", "major"),
        ("v1.30.0", None, "desired version is not"),
        (None, "v1.30.0", "current version is not"),
    ],
)
def test_upgrade_problem_explains_without_echoing_versions(old: Any, new: Any, why: str) -> None:
    problem = upgrade_problem(old, new)
    assert problem is not None and why in problem
    assert all(version not in problem for version in (old, new) if isinstance(version, str))
