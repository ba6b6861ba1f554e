"""The retryAfterSeconds rule and the expected end of a play in flight (runs/play_time.py), pure."""

from __future__ import annotations

from dataclasses import replace

from inplace_extension.runs import play_time
from inplace_extension.runs.attempts import Attempt, Outcome, OutcomeKind
from inplace_extension.runs.memo import DEFAULT_BOUND
from inplace_extension.runs.play_time import PlayTimes, end_window, known_cost, retry_after

from .test_service import req


def attempt(
    number: int, started: float, finished: float | None, kind: OutcomeKind = OutcomeKind.SUCCESSFUL
) -> Attempt:
    outcome = None if finished is None else Outcome(kind, finished=finished)
    return Attempt(number=number, path=None, retry_token="", outcome=outcome, started=started)


def test_retry_after_lands_the_next_poll_as_the_end_window_opens_within_bounds() -> None:
    assert retry_after(7.0, 2.0, 10) == 5  # at the window's start: 2 s before the expected end
    assert retry_after(7.2, 2.0, 10) == 6  # 0.8 s inside it, never before it
    assert retry_after(3.0, 2.0, 10) == 1
    assert retry_after(-4.0, 2.0, 10) == 1  # overran: soon, never 0 (CAPI would read 0 as done)
    assert retry_after(120.0, 2.0, 10) == 10  # never longer than --retry-after-seconds
    assert retry_after(120.0, 2.0, 1) == 1


def test_the_end_window_is_a_share_of_the_expected_duration_at_least_its_minimum() -> None:
    assert end_window(3.0) == play_time.WINDOW_MIN_SECONDS
    assert end_window(6.0) == 1.5
    assert end_window(40.0) == 10.0  # a play a quarter faster than expected still ends inside it
    times = PlayTimes()
    times.learn(req("m1"), [attempt(1, 100.0, 140.0)])
    assert times.window(req("m1"), ()) == 10.0


def test_a_poll_as_the_window_opens_waits_past_the_expected_end() -> None:
    """The wait of the poll that lands as the window opens (up to a second after: whole seconds) reaches
    past the expected end, at least a second past for a play of up to 4 s, however far into the play the
    first poll came: a play a little longer than expected is answered as it ends, not on the next poll."""
    for expected, past in ((2.5, 1.0), (2.9, 1.0), (3.0, 1.0), (4.0, 1.0), (6.0, 0.5), (7.9, 0.0)):
        window = end_window(expected)
        for gone in (0.0, 0.3, 0.7):
            lands = gone + retry_after(expected - gone, window, 10)
            assert expected - window <= lands  # in the window: it waits
            assert lands + play_time.NEAR_END_SECONDS >= expected + past, (expected, gone)


def test_known_costs_count_the_start_and_each_step() -> None:
    assert known_cost(()) == play_time.PLAY_START_SECONDS
    assert known_cost(("kubeadm_files", "kubelet_args")) == play_time.PLAY_START_SECONDS + 1.0 + 3.0
    assert known_cost(("os_image",)) == play_time.PLAY_START_SECONDS + play_time.CUSTOM_STEP_SECONDS


def test_the_machines_last_play_then_any_machines_then_the_known_cost() -> None:
    times = PlayTimes()
    m1, m2 = req("m1"), req("m2")
    assert times.expected(m1) == known_cost(m1.capabilities)
    times.learn(m2, [attempt(1, 100.0, 105.0)])
    assert times.expected(m1) == 5.0  # the same steps on another Machine
    times.learn(m1, [attempt(1, 100.0, 108.0), attempt(2, 200.0, 207.5)])
    assert times.expected(m1) == 7.5  # its own last play
    assert times.expected(m2) == 5.0
    times.learn(m1, [attempt(3, 300.0, 301.0, OutcomeKind.UNREACHABLE)])  # no play ran: nothing learned
    assert times.expected(m1) == 7.5
    other_steps = replace(m1, capabilities=("ntp",))
    assert times.expected(other_steps) == known_cost(("ntp",))


def test_the_shortest_of_the_last_three_plays_is_expected_each_play_counted_once() -> None:
    """A play far shorter than expected is answered a whole retryAfterSeconds late, one longer costs at
    most a second: the expectation is the shortest of the Machine's last three plays."""
    times = PlayTimes()
    m1 = req("m1")
    for number, seconds in enumerate((9.0, 20.0, 12.0), 1):
        times.learn(m1, [attempt(number, 100.0, 100.0 + seconds)])
        times.learn(m1, [attempt(number, 100.0, 100.0 + seconds)])  # the next poll reads it again
    assert times.expected(m1) == 9.0
    times.learn(m1, [attempt(4, 100.0, 115.0)])  # 9 s is no longer among the last three
    assert times.expected(m1) == 12.0
    for fingerprint in ("cd", "ef"):  # the Machine's next updates (new idents, their attempt 1)
        times.learn(replace(m1, fingerprint=fingerprint * 32), [attempt(1, 100.0, 130.0)])
    assert times.expected(m1) == 15.0  # of 15, 30, 30


def test_remaining_counts_from_the_records_attempt_in_flight_else_from_the_launch() -> None:
    times = PlayTimes()
    request = req("m1")
    expected = known_cost(request.capabilities)
    # the record has the attempt in flight (the kubernetes executor's): it began at 100
    assert times.remaining(request, [attempt(1, 100.0, None)], now=101.0) == expected - 1.0
    # the record as read before the launch (the local executor's cache): the launch this process saw
    times.began(request.ident, 200.0)
    assert times.remaining(request, [attempt(1, 100.0, 150.0)], now=203.0) == expected - 3.0
    # a retry of the same ident launched later starts the count again
    times.began(request.ident, 300.0)
    assert times.remaining(request, [], now=300.5) == expected - 0.5
    # never launched here nor recorded (another replica's, a restart): counted from the first look
    other = req("m2")
    assert times.remaining(other, [], now=400.0) == expected
    assert times.remaining(other, [], now=401.0) == expected - 1.0


def test_what_is_remembered_is_bounded() -> None:
    times = PlayTimes()
    request = req("m1")
    times.began(request.ident, 0.0)
    assert times.remaining(request, [], now=1.0) == known_cost(request.capabilities) - 1.0
    for n in range(DEFAULT_BOUND):
        times.began(f"default.other-{n}.abababababab", float(n))
    # the oldest launch forgotten: counted from this look, as for a play never seen before
    assert times.remaining(request, [], now=10.0) == known_cost(request.capabilities)
