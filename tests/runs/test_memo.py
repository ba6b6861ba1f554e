"""The run service's bounded memory of what it did already (runs/memo.py): it forgets the oldest first."""

from __future__ import annotations

import pytest

from inplace_extension.runs.memo import Memo


def test_past_its_bound_the_oldest_key_is_forgotten_and_a_re_added_key_is_young_again() -> None:
    memo: Memo[str] = Memo(bound=2)
    memo.add("a")
    memo.add("b")
    memo.add("a")  # "a" is the youngest now
    memo.add("c")
    assert "a" in memo and "c" in memo
    assert "b" not in memo
    assert len(memo) == 2


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="bound must be >= 1"):
        Memo(bound=0)
