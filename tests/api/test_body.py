"""Request bytes -> model: a bad body becomes InvalidRequest naming a field path, never echoing a value."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from inplace_extension.api.body import MAX_DEPTH, field_path, parse_json, parse_request
from inplace_extension.api.inplace import CanUpdateMachineRequest, UpdateMachineRequest
from inplace_extension.errors import InvalidRequest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "capi"
SECRET = "abcdef.0123456789abcdef"


def request_6a() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "update_machine" / "6A.request.json").read_text())
    return data


def test_field_path_joins_names_and_indexes() -> None:
    assert field_path(("desired", "bootstrapConfig", "spec", "files", 2, "path")) == (
        "desired.bootstrapConfig.spec.files[2].path"
    )
    assert field_path(()) == "(body)"


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        (b"", "(body)", "invalid JSON"),
        (b"{not json", "(body)", "invalid JSON"),
        (b'{"a": "\xff\xfe"}', "(body)", "invalid JSON"),  # invalid UTF-8
        (b'{"a": "x\x00y"}', "(body)", "invalid JSON"),  # raw NUL in a string
        (b'{"a": NaN}', "(body)", "invalid JSON"),
        (b'{"a": [1, 2e999]}', "a[1]", "number out of range"),
        (b"[1][2]", "(body)", "invalid JSON"),
    ],
)
def test_parse_json_refuses_what_go_refuses(body: bytes, path: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_json(body)
    assert info.value.where == path
    assert words in info.value.problem


def test_parse_json_fails_fast_when_nested_ten_thousand_deep() -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as info:
        parse_json(b"[" * 10_000 + b"]" * 10_000)
    assert "recursion limit" in info.value.problem
    assert time.perf_counter() - started < 1.0


def test_parse_json_refuses_nesting_past_our_depth_bound() -> None:
    body = '{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)
    with pytest.raises(InvalidRequest) as info:
        parse_json(body.encode())
    assert info.value.where.startswith("a.a.a")
    assert "nested deeper" in info.value.problem


def test_parse_json_keeps_huge_integers_exact() -> None:
    assert parse_json(b'{"n": 123456789012345678901234567890}') == {"n": 123456789012345678901234567890}


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["desired"].pop("machine"), "desired.machine: missing"),
        (lambda d: d["desired"]["machine"]["metadata"].update(name=7), "desired.machine.metadata.name"),
        (lambda d: d.update(settings={"token": ["x"]}), "settings.token"),
        (lambda d: d["desired"].update(bootstrapConfig="text"), "desired.bootstrapConfig"),
        (
            lambda d: d["desired"]["infrastructureMachine"].update(spec=[1]),
            "desired.infrastructureMachine.spec",
        ),
    ],
)
def test_parse_request_names_the_failing_field(mutate: Any, path: str) -> None:
    document = request_6a()
    mutate(document)
    with pytest.raises(InvalidRequest) as info:
        parse_request(UpdateMachineRequest, json.dumps(document).encode())
    assert str(info.value).startswith(f"InvalidRequest: {path}")


def test_parse_request_never_echoes_the_offending_value() -> None:
    document = request_6a()
    document["desired"]["machine"]["metadata"]["name"] = {"token": SECRET}
    document["settings"] = {"k": {"token": SECRET}}
    with pytest.raises(InvalidRequest) as info:
        parse_request(UpdateMachineRequest, json.dumps(document).encode())
    assert SECRET not in str(info.value)
    # both problems, each with its path: none hidden behind a count
    assert "settings.k: must be a string" in str(info.value)
    assert "desired.machine.metadata.name: must be a string" in str(info.value)


def test_a_misspelt_key_is_named_beside_the_key_it_hides_and_the_other_problems() -> None:
    """Issue 39: the wire models ignore unknown keys (as Go's decoder does), so ``machin`` leaves
    ``machine`` missing: the answer says which key the request most likely meant, and a second problem
    does not hide it behind "(and 1 more problem)"."""
    document = request_6a()
    document["desired"]["machin"] = document["desired"].pop("machine")
    document["desired"]["infrastructureMachine"]["kind"] = 5
    with pytest.raises(InvalidRequest) as info:
        parse_request(UpdateMachineRequest, json.dumps(document).encode())
    assert info.value.where == "desired.machine"
    assert str(info.value) == (
        'InvalidRequest: desired.machine: missing (the request has "machin": did you mean "machine"?); '
        "desired.infrastructureMachine.kind: must be a string"
    )


def test_many_problems_are_named_up_to_a_bound_and_counted_beyond() -> None:
    document = request_6a()
    document["settings"] = {f"k{i}": i for i in range(8)}
    with pytest.raises(InvalidRequest) as info:
        parse_request(UpdateMachineRequest, json.dumps(document).encode())
    text = str(info.value)
    assert [f"settings.k{i}: must be a string" in text for i in range(8)] == [True] * 5 + [False] * 3
    assert text.endswith("(and 3 more problems)")


def test_parse_request_refuses_an_array_body() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(CanUpdateMachineRequest, b"[]")
    assert info.value.where == "(body)"
