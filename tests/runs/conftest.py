"""Fixtures of the run engine's tests: ansible-runner's start replaced by the fake of ``fakes.py``."""

from __future__ import annotations

import pytest

from inplace_extension.plays import runner as runner_mod

from .fakes import FakeRunner


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    """``runner.start`` replaced by a :class:`FakeRunner` that records every batch it is given."""
    fake = FakeRunner()
    monkeypatch.setattr(runner_mod, "start", fake.start)
    return fake
