"""The UpdateMachine state machine (docs/operations.md) as a pure function of the attempts on disk."""

from __future__ import annotations

from pathlib import Path

from inplace_extension.runs.attempts import Attempt, Outcome, OutcomeKind
from inplace_extension.runs.policy import Verdict, backoff_seconds, decide, retry_token

NOW = 1000.0


def att(
    n: int,
    kind: OutcomeKind | None,
    token: str = "",
    finished: float = NOW,
    capability: str | None = None,
    task: str | None = None,
) -> Attempt:
    outcome = None if kind is None else Outcome(kind, capability, task, finished=finished)
    return Attempt(n, Path(f"/x/attempt-{n:04d}"), token, outcome)


def test_nothing_yet_starts() -> None:
    assert decide([], "", NOW, 10).verdict is Verdict.START


def test_any_success_is_done() -> None:
    attempts = [att(1, OutcomeKind.UNREACHABLE), att(2, OutcomeKind.SUCCESSFUL)]
    assert decide(attempts, "", NOW, 10).verdict is Verdict.DONE


def test_task_failure_is_remembered_until_the_retry_token_changes() -> None:
    attempts = [att(1, OutcomeKind.TASK_FAILED, token="", capability="ntp", task="Write config")]
    first = decide(attempts, "", NOW, 10)
    again = decide(attempts, "", NOW + 9999, 10)
    assert first.verdict is Verdict.FAILED
    assert first.message == 'ntp: task "Write config" failed on host'
    assert again == first
    retried = decide(attempts, retry_token("1"), NOW, 10)
    assert (retried.verdict, retried.next_attempt) == (Verdict.START, 2)


def test_retriable_outcomes_back_off_exponentially() -> None:
    one = [att(1, OutcomeKind.UNREACHABLE, finished=NOW - 3)]
    d = decide(one, "", NOW, 10)
    assert (d.verdict, d.wait_seconds, d.message) == (
        Verdict.WAIT,
        7,
        "host unreachable, retrying (attempt 2)",
    )
    assert decide(one, "", NOW + 7, 10).verdict is Verdict.START
    three = [
        att(1, OutcomeKind.UNREACHABLE),
        att(2, OutcomeKind.INTERRUPTED),
        att(3, OutcomeKind.UNREACHABLE),
    ]
    d = decide(three, "", NOW + 1, 10)
    assert (d.verdict, d.wait_seconds, d.message) == (
        Verdict.WAIT,
        39,
        "host unreachable, retrying (attempt 4)",
    )
    # a remembered failure before the retriable tail does not count toward the backoff
    mixed = [att(1, OutcomeKind.TASK_FAILED, token="a"), att(2, OutcomeKind.INTERRUPTED, token="b")]
    d = decide(mixed, "b", NOW, 10)
    assert (d.verdict, d.wait_seconds, d.message) == (
        Verdict.WAIT,
        10,
        "run interrupted, retrying (attempt 3)",
    )


def test_attempt_without_outcome_is_restarted_at_once() -> None:
    d = decide([att(1, OutcomeKind.UNREACHABLE, finished=NOW), att(2, None)], "", NOW, 10)
    assert (d.verdict, d.next_attempt) == (Verdict.START, 3)


def test_backoff_is_capped_and_token_is_hashed() -> None:
    assert [backoff_seconds(n, 10) for n in (1, 2, 3, 4)] == [10, 20, 40, 80]
    assert backoff_seconds(30, 10) == 300
    assert retry_token(None) == ""
    assert retry_token("x") != retry_token("y")
    assert len(retry_token("x")) == 16


def test_host_busy_is_retried_with_its_own_message() -> None:
    d = decide([att(1, OutcomeKind.HOST_BUSY)], "", NOW, 10)
    assert (d.verdict, d.message) == (Verdict.WAIT, "host locked by another run, retrying (attempt 2)")


def test_a_new_retry_token_skips_the_backoff() -> None:
    attempts = [att(1, OutcomeKind.UNREACHABLE, token="")]
    assert decide(attempts, "", NOW, 10).verdict is Verdict.WAIT
    d = decide(attempts, retry_token("now"), NOW, 10)
    assert (d.verdict, d.next_attempt) == (Verdict.START, 2)


def test_the_retry_budget_blocks_after_n_failed_attempts_with_the_last_reason() -> None:
    two = [
        att(1, OutcomeKind.UNREACHABLE, finished=NOW - 999),
        att(2, OutcomeKind.INTERRUPTED, finished=NOW - 999),
    ]
    assert decide(two, "", NOW, 10, budget=3).verdict is Verdict.START
    three = [*two, att(3, OutcomeKind.UNREACHABLE, finished=NOW - 999)]
    blocked = decide(three, "", NOW, 10, budget=3)
    assert (blocked.verdict, blocked.blocked) == (Verdict.FAILED, True)
    assert blocked.message == "blocked after 3 failed attempts: host unreachable"
    assert decide(three, "", NOW + 9999, 10, budget=3) == blocked, "stays blocked"
    assert decide(three, "", NOW, 10).verdict is Verdict.START, "no budget: retried for ever"


def test_a_drain_that_could_not_reach_the_api_server_is_named_as_the_reason() -> None:
    drained = Outcome(OutcomeKind.INTERRUPTED, finished=NOW, message="drain: the API server is unreachable")
    attempts = [att(1, OutcomeKind.UNREACHABLE), Attempt(2, Path("/x/attempt-0002"), "", drained)]
    blocked = decide(attempts, "", NOW, 10, budget=2)
    assert blocked.message == "blocked after 2 failed attempts: drain: the API server is unreachable"


def test_a_new_retry_token_resets_the_budget_and_host_busy_does_not_spend_it() -> None:
    old = [att(n, OutcomeKind.UNREACHABLE, finished=NOW - 999) for n in (1, 2, 3)]
    assert decide(old, "", NOW, 10, budget=3).verdict is Verdict.FAILED
    token = retry_token("again")
    assert decide(old, token, NOW, 10, budget=3).verdict is Verdict.START
    retried = [
        *old,
        att(4, OutcomeKind.UNREACHABLE, token, NOW - 999),
        att(5, OutcomeKind.UNREACHABLE, token, NOW - 999),
    ]
    assert decide(retried, token, NOW, 10, budget=3).verdict is Verdict.START, "2 of 3 with this token"
    busy = [att(n, OutcomeKind.HOST_BUSY, finished=NOW - 999) for n in (1, 2, 3, 4)]
    assert decide(busy, "", NOW, 10, budget=3).verdict is Verdict.START


def test_an_attempt_taken_back_before_its_play_is_as_if_it_never_was() -> None:
    """Withdrawn (a hold came while its Job's Pod had not started): no backoff, no budget spent, and a
    remembered task failure stays remembered; only its number is used up."""
    withdrawn = att(2, OutcomeKind.WITHDRAWN)
    now = decide([withdrawn], "", NOW, 10, budget=1)
    assert (now.verdict, now.next_attempt) == (Verdict.START, 3)
    spent = decide([att(1, OutcomeKind.UNREACHABLE, finished=NOW - 100), withdrawn], "", NOW, 10, budget=2)
    assert (spent.verdict, spent.next_attempt) == (Verdict.START, 3), "one failure of a budget of 2"
    failed = decide([att(1, OutcomeKind.TASK_FAILED, capability="ntp", task="t"), withdrawn], "", NOW, 10)
    assert failed.verdict is Verdict.FAILED


def test_a_job_that_died_past_its_drain_point_is_resumed_after_its_backoff_within_the_budget() -> None:
    """(``kubernetes``) its interrupted outcome says its Job died mid-play past its drain point: the
    next attempt resumes it (nothing holds it back, its backoff neither) but waits out the backoff and
    counts against the budget as any interrupted attempt; one that died before it is a new start."""

    def dead(n: int, past: bool, token: str = "") -> Attempt:
        outcome = Outcome(OutcomeKind.INTERRUPTED, finished=NOW, died_past_drain_point=past)
        return Attempt(n, None, token, outcome)

    waiting = decide([dead(1, True)], "", NOW, 10)
    assert (waiting.verdict, waiting.resumes) == (Verdict.WAIT, True)
    assert waiting.message == "run interrupted, retrying (attempt 2)"
    resumed = decide([dead(1, True)], "", NOW + 10, 10)
    assert (resumed.verdict, resumed.resumes, resumed.next_attempt) == (Verdict.START, True, 2)
    assert decide([dead(1, True)], retry_token("1"), NOW, 10).resumes, "a retry by annotation resumes too"
    new = decide([dead(1, False)], "", NOW + 10, 10)
    assert (new.verdict, new.resumes) == (Verdict.START, False)
    assert not decide([dead(1, False)], "", NOW, 10).resumes
    blocked = decide([dead(1, True), dead(2, True)], "", NOW + 100, 10, budget=2)
    assert (blocked.verdict, blocked.blocked, blocked.resumes) == (Verdict.FAILED, True, False)
    assert not decide([att(1, OutcomeKind.INTERRUPTED)], "", NOW + 10, 10).resumes, "a play that ended"
