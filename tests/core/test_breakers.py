"""A target's circuit breaker and a request's retry budget, on a fake clock."""

from __future__ import annotations

from llmgw.core.breakers import Breaker, BreakerRule, Breakers, BreakerState
from llmgw.core.fallbacks import FallbackSettings, RetryBudget
from llmgw.testing.clock import FakeClock

RULE = BreakerRule(failures=3, window_s=10.0, open_s=20.0)


def opened(clock: FakeClock) -> Breaker:
    breaker = Breaker(RULE, clock)
    for _ in range(RULE.failures):
        breaker.failed()
    return breaker


def test_a_closed_breaker_lets_every_request_through() -> None:
    breaker = Breaker(RULE, FakeClock())
    assert all(breaker.allows() for _ in range(10))
    assert breaker.current() is BreakerState.CLOSED


def test_failures_within_the_window_open_it() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    assert breaker.current() is BreakerState.OPEN
    assert not breaker.allows()
    assert breaker.retry_after_s() == 20.0


async def test_failures_spread_wider_than_the_window_leave_it_closed() -> None:
    clock = FakeClock()
    breaker = Breaker(RULE, clock)
    for _ in range(5):
        breaker.failed()
        await clock.advance(6.0)  # never three within 10 s
    assert breaker.current() is BreakerState.CLOSED


def test_successes_between_failures_within_the_window_do_not_hide_them() -> None:
    breaker = Breaker(RULE, FakeClock())
    for _ in range(RULE.failures):
        breaker.failed()
        breaker.succeeded()
    assert breaker.current() is BreakerState.OPEN


async def test_once_open_s_passed_one_request_tries_and_no_other_meanwhile() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    await clock.advance(19.9)
    assert not breaker.allows()
    await clock.advance(0.1)
    assert breaker.current() is BreakerState.HALF_OPEN
    assert breaker.allows()
    assert not breaker.allows()


async def test_the_trial_succeeding_closes_it() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    await clock.advance(20.0)
    assert breaker.allows()
    breaker.succeeded()
    assert breaker.current() is BreakerState.CLOSED
    assert breaker.allows() and breaker.allows()


async def test_the_trial_failing_opens_it_for_open_s_again() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    await clock.advance(25.0)
    assert breaker.allows()
    breaker.failed()
    assert breaker.current() is BreakerState.OPEN
    await clock.advance(19.0)
    assert not breaker.allows()
    assert breaker.retry_after_s() == 1.0


async def test_a_trial_that_told_nothing_lets_the_next_request_try() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    await clock.advance(20.0)
    assert breaker.allows()
    breaker.released()
    assert breaker.allows()


def test_breakers_are_one_per_target() -> None:
    clock = FakeClock()
    breakers = Breakers(RULE, clock)
    for _ in range(3):
        breakers.of("big").failed()
    assert breakers.states() == {"big": BreakerState.OPEN}
    assert breakers.of("small").allows()
    assert breakers.states() == {"big": BreakerState.OPEN, "small": BreakerState.CLOSED}


def test_a_budget_allows_as_many_targets_as_set() -> None:
    clock = FakeClock()
    budget = RetryBudget(FallbackSettings(max_targets=2, budget_s=30.0), clock(), clock)
    assert budget.spent() == ""
    budget.take()
    assert budget.spent() == ""
    budget.take()
    assert budget.spent() == "targets"


async def test_a_budget_ends_when_its_time_passed_since_the_request_arrived() -> None:
    clock = FakeClock()
    budget = RetryBudget(FallbackSettings(max_targets=5, budget_s=3.0), clock() - 1.0, clock)
    await clock.advance(1.9)
    assert budget.spent() == ""
    await clock.advance(0.1)
    assert budget.spent() == "time"


def test_a_budget_of_no_targets_allows_none() -> None:
    clock = FakeClock()
    assert RetryBudget(FallbackSettings(max_targets=0), clock(), clock).spent() == "targets"
