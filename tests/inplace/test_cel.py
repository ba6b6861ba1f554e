"""CEL expressions over one object (inplace/cel.py): refused at compile time when they cannot work,
never raising when evaluated, holding only on ``true``."""

from __future__ import annotations

import pytest

from inplace_extension.inplace.cel import Evaluation, ExpressionError, compile_expression

CEPH = {"status": {"health": "HEALTH_WARN"}}
STS = {
    "spec": {"replicas": 3},
    "status": {"readyReplicas": 3, "conditions": [{"type": "Ready", "status": "True"}]},
}


@pytest.mark.parametrize(
    ("text", "obj", "holds"),
    [
        ('object.status.health == "HEALTH_OK"', CEPH, False),
        ('object.status.health == "HEALTH_OK"', {"status": {"health": "HEALTH_OK"}}, True),
        ("object.status.readyReplicas == object.spec.replicas", STS, True),
        ("object.status.readyReplicas == object.spec.replicas", {**STS, "spec": {"replicas": 4}}, False),
        ('object.status.conditions.exists(c, c.type == "Ready" && c.status == "True")', STS, True),
        ('has(object.status.health) && object.status.health == "HEALTH_OK"', {"status": {}}, False),
        ("type(object.spec.replicas) == int", STS, True),
    ],
)
def test_an_expression_holds_only_when_it_is_true(text: str, obj: dict[str, object], holds: bool) -> None:
    assert compile_expression(text).evaluate(obj) == Evaluation(holds)


@pytest.mark.parametrize(
    ("text", "obj", "error"),
    [
        ('object.status.health == "HEALTH_OK"', {"spec": {}}, "no such member in mapping: 'status'"),
        ("object.status.readyReplicas > 'three'", STS, "no matching overload"),
        ("object.spec.replicas", STS, "the value is of type int, not bool"),
    ],
)
def test_evaluation_errors_do_not_hold_and_say_why_in_one_short_line(
    text: str, obj: dict[str, object], error: str
) -> None:
    evaluation = compile_expression(text).evaluate(obj)
    assert not evaluation.holds
    assert evaluation.error is not None and error in evaluation.error
    assert "\n" not in evaluation.error and len(evaluation.error) <= 200
    assert "activation" not in evaluation.error  # not the evaluation context celpy appends


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("object.status.", "not a CEL expression: syntax error at column 14"),
        ('object.status.health = "HEALTH_OK"', "syntax error"),
        ('obj.status.health == "HEALTH_OK"', "unknown name 'obj'"),
        ('object.status.conditions.exists(c, d.type == "Ready")', "unknown name 'd'"),
    ],
)
def test_expressions_that_cannot_work_are_refused_when_compiled(text: str, words: str) -> None:
    with pytest.raises(ExpressionError, match=words):
        compile_expression(text)
