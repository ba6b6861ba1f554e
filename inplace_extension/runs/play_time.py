"""When a play in flight is expected to end, and what a poll does about it: the ``retryAfterSeconds``
rule and the near-end wait (issue 31, "the answer follows the play's end").

A play's expected duration is, first found:

1. the shortest of the last :data:`PLAYS_KEPT` plays of the same steps on the same Machine that this
   process saw end successfully (each its attempt's ``started`` to its outcome's ``finished``, from the
   record);
2. else the shortest of the last :data:`PLAYS_KEPT` such plays on any Machine;
3. else the steps' known costs: :data:`PLAY_START_SECONDS` plus :data:`STEP_SECONDS` per shipped step
   (:data:`CUSTOM_STEP_SECONDS` for a user-defined one).

The duration is decided when the attempt is launched and recorded with it (the ``kubernetes`` record:
every replica, a fresh one too, expects the same end and answers alike); an attempt whose record has
none is expected to take the duration found now. The expected remaining time is that duration less the
time since the attempt began (the record's ``started``; else when this process launched it or first
saw it in flight). The play may end early by
up to the **end window**: :data:`EARLY_SHARE` of its expected duration, at least
:data:`WINDOW_MIN_SECONDS` (a play's duration varies with the machine's load). A poll then:

- remaining inside the end window (or past the expected end): waits for the end, at most
  :data:`NEAR_END_SECONDS` (well inside CAPI's 10 s call timeout), and answers from the record if the
  play ended meanwhile (``update applied``); a play still going is answered with ``retryAfterSeconds`` 1;
- before the window: answers in progress at once, with ``retryAfterSeconds`` = ``ceil(remaining -
  window)``, at least 1 and at most ``--retry-after-seconds``: the next poll lands at the window's start,
  so the answer follows the play's end instead of a whole ``retryAfterSeconds`` later.

What was learned is process memory, bounded: forgetting only falls back to the known costs for the
next launch; an attempt launched already keeps the expectation recorded with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from inplace_extension.runs.attempts import Attempt, OutcomeKind
from inplace_extension.runs.memo import Recent
from inplace_extension.runs.model import RunRequest

# a poll this close to a play's expected end waits for the end, at most this long (CAPI's call timeout
# for UpdateMachine is 10 s: the hook table's timeoutSeconds, so 7 s of margin). 3 s rather than 2 s:
# a play of one module execution ends within about a second either side of the shortest of its last
# plays, and with 2 s three of ten such plays on a real node ended just after the wait, each answered by
# the next poll 0.7-1.2 s late; with 3 s none of ten (bench/README.md, issue 31, one module execution).
NEAR_END_SECONDS: Final = 3.0
# a play may end this share of its expected duration early: its polls wait for the end from then on
EARLY_SHARE: Final = 0.25
# The shortest end window. Shorter than the near-end wait: the poll the window's start asks for lands up
# to a second after it (retryAfterSeconds is whole seconds) and waits NEAR_END_SECONDS from there, so
# that wait reaches past the expected end (two seconds past for a play of up to 4 s), and a play a little
# longer than the shortest of its last plays (the expectation) is still answered as it ends. A window
# as long as the wait ended the wait at the expected end: such a play was answered on the next poll,
# up to a second late (bench/README.md, issue 31, fewer controller-side tasks).
WINDOW_MIN_SECONDS: Final = 1.0
# how many ended plays the expectation looks at; the shortest wins: a play longer than expected costs
# at most a second (in its end window polls are held 3 s of every 4), one far shorter than expected up
# to a whole retryAfterSeconds (measured: bench/README.md, issue 31 item 3)
PLAYS_KEPT: Final = 3
# ansible-playbook's start-up, the host lock and stamp read: before the first step's work
PLAY_START_SECONDS: Final = 2.0
# what each shipped step costs on a real node (bench/README.md, issue 31: the kubelet's restart and
# health wait are most of kubelet_args; a version step that really upgrades pulls packages)
STEP_SECONDS: Final = {
    "users": 1.0,
    "ntp": 1.0,
    "kubeadm_files": 1.0,
    "kubelet_args": 3.0,
    "kubernetes_version": 20.0,
}
CUSTOM_STEP_SECONDS: Final = 3.0


def known_cost(capabilities: Sequence[str]) -> float:
    """The play's expected duration from its steps' known costs alone."""
    return PLAY_START_SECONDS + sum(STEP_SECONDS.get(step, CUSTOM_STEP_SECONDS) for step in capabilities)


def end_window(expected: float) -> float:
    """How long before its expected end a play of ``expected`` seconds may end: polls wait for it then."""
    return max(WINDOW_MIN_SECONDS, EARLY_SHARE * expected)


def retry_after(remaining: float, window: float, longest: int) -> int:
    """``retryAfterSeconds`` for a play expected to end in ``remaining`` seconds with its end window
    ``window``: the next poll lands at the window's start; at least 1, at most ``longest``
    (``--retry-after-seconds``)."""
    return max(1, min(longest, math.ceil(remaining - window)))


# a play that ended: its attempt (run ident, attempt number) and its duration in seconds
_Play = tuple[tuple[str, int], float]


def _kept(plays: tuple[_Play, ...] | None, play: _Play) -> tuple[_Play, ...]:
    """The last :data:`PLAYS_KEPT` plays with ``play``, once (every poll of a done update reads it)."""
    plays = plays or ()
    if any(attempt == play[0] for attempt, _ in plays):
        return plays
    return (*plays, play)[-PLAYS_KEPT:]


class PlayTimes:
    """The durations of plays this process saw end, and when the plays in flight began."""

    def __init__(self) -> None:
        # bounded as the memos are: forgetting only falls back to the known costs, or counts from now
        # each: the last PLAYS_KEPT plays, as (attempt, seconds)
        self._by_machine: Recent[tuple[str, tuple[str, ...]], tuple[_Play, ...]] = Recent()
        self._by_steps: Recent[tuple[str, ...], tuple[_Play, ...]] = Recent()
        self._began: Recent[str, float] = Recent()  # ident -> when this process launched or first saw it

    def learn(self, request: RunRequest, attempts: Sequence[Attempt]) -> None:
        """Remember the duration of ``request``'s last successful play in ``attempts`` (the record)."""
        ended = [
            (a.number, a.outcome.finished - a.started)
            for a in attempts
            if a.outcome is not None
            and a.outcome.kind is OutcomeKind.SUCCESSFUL
            and 0 < a.started < a.outcome.finished
        ]
        if not ended:
            return
        number, seconds = max(ended)
        play = ((request.ident, number), seconds)
        machine_key = (request.machine, request.capabilities)
        self._by_machine.set(machine_key, _kept(self._by_machine.get(machine_key), play))
        self._by_steps.set(request.capabilities, _kept(self._by_steps.get(request.capabilities), play))

    def began(self, ident: str, at: float) -> None:
        """This process launched a new attempt of ``ident`` at ``at``."""
        self._began.set(ident, at)

    def expected(self, request: RunRequest) -> float:
        """The expected duration of ``request``'s play (the rule in the module's docstring)."""
        for plays in (
            self._by_machine.get((request.machine, request.capabilities)),
            self._by_steps.get(request.capabilities),
        ):
            if plays:
                return min(seconds for _, seconds in plays)
        return known_cost(request.capabilities)

    def window(self, request: RunRequest, attempts: Sequence[Attempt]) -> float:
        """The end window of ``request``'s play in flight (the module's docstring)."""
        return end_window(self._in_flight_expected(request, attempts))

    def remaining(self, request: RunRequest, attempts: Sequence[Attempt], now: float) -> float:
        """Seconds until ``request``'s play in flight is expected to end (negative: it overran).
        ``attempts``: the record as last read; its last attempt, if without an outcome, says when it began
        and (when recorded) how long it is expected to take."""
        expected = self._in_flight_expected(request, attempts)
        return expected - (now - self._began_at(request.ident, attempts, now))

    def _in_flight_expected(self, request: RunRequest, attempts: Sequence[Attempt]) -> float:
        last = max(attempts, key=lambda a: a.number, default=None)
        if last is not None and last.outcome is None and last.expected > 0:
            return last.expected  # decided at its launch, by whichever replica launched it
        return self.expected(request)

    def _began_at(self, ident: str, attempts: Sequence[Attempt], now: float) -> float:
        last = max(attempts, key=lambda a: a.number, default=None)
        if last is not None and last.outcome is None and last.started > 0:
            return last.started
        # not in the record as read (the local backend's cache is read before the launch)
        launched = self._began.get(ident)
        if launched is None:
            self._began.set(ident, now)
            return now
        return launched
