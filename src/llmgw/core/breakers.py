"""Circuit breakers: a target that keeps failing is skipped for a while, then tried once again.

One :class:`Breaker` per target (a catalog model a request may fall to). It counts the target's
failures in a sliding window; ``failures`` of them within ``window_s`` open it (successes between
them do not hide them). While open,
:meth:`Breaker.allows` is False: a request that has somewhere else to go skips the target. Once
``open_s`` passed it is half open: the next :meth:`Breaker.allows` lets one request through (and
no other while that one is out); its success closes the breaker, its failure opens it again.

Pure: the time comes from the ``clock`` passed in (seconds, monotonic), nothing sleeps.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class BreakerState(enum.IntEnum):
    """Where a breaker stands (its value is the ``llmgw_gateway_breaker_state`` gauge's)."""

    CLOSED = 0
    """Requests go through; failures are counted."""
    OPEN = 1
    """The target is skipped until ``open_s`` passed."""
    HALF_OPEN = 2
    """One request goes through to try the target."""


@dataclass(frozen=True, slots=True)
class BreakerRule:
    """When a breaker opens and for how long."""

    failures: int = 5
    """Failures within ``window_s`` that open it."""
    window_s: float = 30.0
    open_s: float = 30.0
    """How long it stays open before one request may try the target."""


class Breaker:
    """One target's circuit breaker."""

    __slots__ = ("_clock", "_failures", "_opened", "_rule", "_trying", "state")

    def __init__(self, rule: BreakerRule, clock: Callable[[], float]) -> None:
        self._rule = rule
        self._clock = clock
        self._failures: deque[float] = deque()
        self._opened = 0.0
        self._trying = False
        """Half open: the one request let through has not been heard of yet."""
        self.state = BreakerState.CLOSED

    def allows(self) -> bool:
        """Whether a request may go to the target now. Half open, True once: the request it lets
        through is the trial, and must be followed by :meth:`succeeded` or :meth:`failed`."""
        state = self.current()
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._trying:
            return False
        self._trying = True
        return True

    def current(self) -> BreakerState:
        """The state now (an open breaker whose time is up reads half open)."""
        if self.state is BreakerState.OPEN and self._clock() - self._opened >= self._rule.open_s:
            self.state = BreakerState.HALF_OPEN
            self._trying = False
        return self.state

    def retry_after_s(self) -> float:
        """Seconds until an open breaker lets a request try again (0: it lets one now)."""
        if self.current() is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened + self._rule.open_s - self._clock())

    def succeeded(self) -> None:
        """The target answered: a trial closes the breaker (its count starts afresh); a closed one
        keeps counting (failures within the window open it, whatever answered between them)."""
        if self.current() is BreakerState.HALF_OPEN:
            self._failures.clear()
            self._trying = False
            self.state = BreakerState.CLOSED

    def failed(self) -> None:
        """The target failed a request: counted; a trial's failure, or the ``failures``-th within
        the window, opens the breaker."""
        now = self._clock()
        if self.current() is BreakerState.HALF_OPEN:
            self._open(now)
            return
        if self.state is BreakerState.OPEN:
            return  # a request let through before it opened: it is open already
        failures = self._failures
        failures.append(now)
        while failures and now - failures[0] > self._rule.window_s:
            failures.popleft()
        if len(failures) >= self._rule.failures:
            self._open(now)

    def released(self) -> None:
        """The request let through ended without telling whether the target works (the client
        left): a half-open breaker lets another one try."""
        self._trying = False

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self._opened = now
        self._trying = False
        self._failures.clear()


class Breakers:
    """The breakers of every target, made as targets are first seen."""

    __slots__ = ("_breakers", "_clock", "rule")

    def __init__(self, rule: BreakerRule, clock: Callable[[], float]) -> None:
        self.rule = rule
        self._clock = clock
        self._breakers: dict[str, Breaker] = {}

    def of(self, target: str) -> Breaker:
        breaker = self._breakers.get(target)
        if breaker is None:
            breaker = self._breakers[target] = Breaker(self.rule, self._clock)
        return breaker

    def states(self) -> dict[str, BreakerState]:
        """Each target's state now, by name."""
        return {target: breaker.current() for target, breaker in sorted(self._breakers.items())}
