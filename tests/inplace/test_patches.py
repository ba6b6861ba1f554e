"""Claims turned into RFC 6902 ops, checked by applying them with the emulator's strict applier."""

from __future__ import annotations

from typing import Any

import pytest
from capi_emulator import apply_json_patch

from inplace_extension.inplace.patches import SpecPatch
from inplace_extension.inplace.pointers import MISSING, changed_pointers, join_pointer, parse_pointer


def _claim(current: dict[str, Any], desired: dict[str, Any], *pointers: str) -> SpecPatch:
    patch = SpecPatch(current, desired, "/spec")
    for pointer in pointers:
        assert patch.claim(parse_pointer(pointer)) is None
    # The ops must turn the real object into the claimed spec, as CAPI's applier would.
    assert apply_json_patch({"spec": current}, patch.ops) == {"spec": patch.spec}
    return patch


def test_claim_replaces_an_existing_value() -> None:
    patch = _claim({"version": "v1.30.0"}, {"version": "v1.31.0"}, "/version")
    assert patch.ops == [{"op": "replace", "path": "/spec/version", "value": "v1.31.0"}]


def test_claim_adds_an_absent_value_at_the_highest_missing_parent() -> None:
    patch = _claim({"a": 1}, {"a": 1, "x": {"y": {"z": 5, "other": 6}}}, "/x/y/z")
    assert patch.ops == [{"op": "add", "path": "/spec/x", "value": {"y": {"z": 5}}}]
    assert patch.spec == {"a": 1, "x": {"y": {"z": 5}}}  # "other" is not claimed


def test_claim_removes_and_prunes_parents_desired_does_not_have() -> None:
    patch = _claim({"keep": 1, "x": {"y": {"z": 5}}}, {"keep": 1}, "/x/y/z")
    assert patch.ops == [{"op": "remove", "path": "/spec/x"}]


def test_claim_removes_only_the_leaf_when_parent_stays_in_desired() -> None:
    patch = _claim({"x": {"y": {"z": 5}}}, {"x": {"y": {}}}, "/x/y/z")
    assert patch.ops == [{"op": "remove", "path": "/spec/x/y/z"}]
    assert patch.spec == {"x": {"y": {}}}


def test_claim_distinguishes_empty_list_from_absent() -> None:
    assert _claim({}, {"files": []}, "/files").ops == [{"op": "add", "path": "/spec/files", "value": []}]
    assert _claim({"files": []}, {}, "/files").ops == [{"op": "remove", "path": "/spec/files"}]


def test_claim_does_nothing_when_values_are_equal() -> None:
    assert _claim({"files": [{"a": 1}]}, {"files": [{"a": 1.0}]}, "/files").ops == []


def test_claim_escapes_pointer_tokens() -> None:
    desired = {"featureGates": {"a/b~c": True}}
    patch = _claim({"featureGates": {}}, desired, "/featureGates/a~1b~0c")
    assert patch.ops == [{"op": "add", "path": "/spec/featureGates/a~1b~0c", "value": True}]


def test_claim_refuses_when_a_parent_is_not_an_object() -> None:
    patch = SpecPatch({"x": [1]}, {"x": {"y": 1}}, "/spec")
    assert patch.claim(("x", "y")) == "a parent of the field is not an object"
    assert patch.ops == []


def test_claim_never_mutates_its_inputs() -> None:
    current = {"x": {"y": 1, "k": 2}}
    desired = {"x": {"y": 3}}
    _claim(current, desired, "/x/y")
    assert current == {"x": {"y": 1, "k": 2}}
    assert desired == {"x": {"y": 3}}


def test_claim_rejects_the_spec_root() -> None:
    with pytest.raises(ValueError, match="below the spec root"):
        SpecPatch({}, {}, "/spec").claim(())


@pytest.mark.parametrize(
    ("current", "desired", "pointers"),
    [
        ({"a": 1}, {"a": 2}, ["/a"]),
        ({}, {"a": {"b": 1, "c": {}}}, ["/a/b", "/a/c"]),
        ({"a": {}}, {}, ["/a"]),
        ({"a": None}, {}, ["/a"]),
        ({"a": [1]}, {"a": [1]}, []),
        ({"a": True}, {"a": 1}, ["/a"]),
        ({"a/b": 1}, {"a/b": 2}, ["/a~1b"]),
    ],
)
def test_changed_pointers(current: Any, desired: Any, pointers: list[str]) -> None:
    assert changed_pointers(current, desired) == pointers


def test_pointer_round_trip_and_missing_is_falsy() -> None:
    tokens = ("a/b", "~c", "")
    assert parse_pointer(join_pointer(tokens)) == tokens
    assert not MISSING
    assert repr(MISSING) == "MISSING"
