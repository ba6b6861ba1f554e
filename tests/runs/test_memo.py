"""The run service's bounded memory of what it did already (runs/memo.py): it forgets the oldest first."""

from __future__ import annotations

import pytest

from inplace_extension.runs.memo import Memo, Recent


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


def test_a_recent_map_forgets_the_least_recently_set_key_past_its_bound() -> None:
    recent: Recent[str, int] = Recent(bound=2)
    recent.set("a", 1)
    recent.set("b", 2)
    recent.set("a", 3)  # "a" is the youngest now
    recent.set("c", 4)
    assert (recent.get("a"), recent.get("b"), recent.get("c")) == (3, None, 4)
    assert len(recent) == 2
    assert recent.pop("a") == 3 and recent.pop("a") is None
    with pytest.raises(ValueError, match="bound must be >= 1"):
        Recent(bound=0)
