"""Budgets in money: counted in nanos beside tokens, refused 429 budget_exceeded once spent, starting
again with the UTC day or month, and validated as limits are."""

from __future__ import annotations

import calendar

import pytest

from llmgw.core.limits import BUDGET_EXCEEDED, DAY_S, Limits, Meter, admit, cost_subject, is_cost_subject
from llmgw.core.pricing import nanos

T0 = float(calendar.timegm((2026, 11, 30, 12, 0, 0, 0, 0, 0)))
"""Noon of the last day of November (UTC)."""
PROJECT = "project:acme/ml/chat"


def test_a_spent_daily_money_budget_refuses_saying_what_was_spent_the_budget_and_the_reset() -> None:
    meter = Meter(PROJECT, Limits(usd_per_day=0.01), T0)
    assert admit([meter], "m", T0) is None
    assert meter.spend(0, T0, nanos(0.012)) is True
    refusal = admit([meter], "m", T0 + 60)
    assert refusal is not None
    assert (refusal.status, refusal.code, refusal.limit) == (429, BUDGET_EXCEEDED, "usd_per_day")
    assert "spent 0.012000 USD this day" in refusal.message
    assert "its budget is 0.01 USD" in refusal.message
    assert "resets at 2026-12-01T00:00:00Z" in refusal.message
    assert refusal.retry_after_s == pytest.approx(12 * 3600 - 60)


def test_money_below_the_budget_is_admitted_and_one_request_may_overshoot_it() -> None:
    meter = Meter(PROJECT, Limits(usd_per_day=0.01), T0)
    assert meter.spend(0, T0, nanos(0.0099)) is False
    assert admit([meter], "m", T0) is None  # the slack: admitted, then counted past the budget
    assert meter.spend(0, T0, nanos(0.005)) is True
    assert admit([meter], "m", T0) is not None


def test_the_daily_money_budget_starts_again_the_next_utc_day_and_the_monthly_one_the_next_month() -> None:
    meter = Meter(PROJECT, Limits(usd_per_day=1.0, usd_per_month=1.5), T0)
    meter.spend(0, T0, nanos(1.0))
    assert admit([meter], "m", T0).limit == "usd_per_day"  # type: ignore[union-attr]
    tomorrow = T0 + DAY_S / 2  # midnight, 1 December: a new day and a new month
    assert admit([meter], "m", tomorrow) is None
    assert (meter.cost_day_used, meter.cost_month_used) == (0, 0)
    meter.spend(0, tomorrow, nanos(1.0))
    later = tomorrow + DAY_S
    meter.spend(0, later, nanos(0.6))  # the month's 1.6 passes its 1.5
    refusal = admit([meter], "m", later)
    assert refusal is not None and refusal.limit == "usd_per_month"
    assert "spent 1.600000 USD this month" in refusal.message
    assert "resets at 2027-01-01T00:00:00Z" in refusal.message


def test_a_refusal_names_the_currency_the_meter_counts_in() -> None:
    meter = Meter(PROJECT, Limits(usd_per_month=2), T0)
    meter.currency = "EUR"
    meter.spend(0, T0, nanos(2))
    refusal = meter.budget(T0)
    assert refusal is not None and "2.000000 EUR" in refusal.message


def test_money_and_tokens_are_counted_apart_and_each_budget_refuses_on_its_own() -> None:
    meter = Meter(PROJECT, Limits(tokens_per_day=1_000, usd_per_day=1.0), T0)
    meter.spend(999, T0, nanos(0.5))
    assert admit([meter], "m", T0) is None
    meter.concurrent -= 1
    meter.spend(1, T0, 0)
    refusal = admit([meter], "m", T0)
    assert refusal is not None and (refusal.limit, refusal.code) == ("tokens_per_day", "rate_limit_exceeded")
    assert meter.unsaved == 1_000 and meter.unsaved_cost == nanos(0.5)


def test_a_budget_of_zero_refuses_at_once() -> None:
    assert admit([Meter(PROJECT, Limits(usd_per_day=0), T0)], "m", T0) is not None


@pytest.mark.parametrize("value", [-0.01, float("nan"), float("inf"), "5", True])
def test_a_money_budget_that_is_no_amount_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="usd_per_day must be"):
        Limits(usd_per_day=value)  # type: ignore[arg-type]


def test_money_budgets_survive_their_dict_shape() -> None:
    limits = Limits(usd_per_day=2.5, usd_per_month=40)
    assert Limits.from_dict(limits.as_dict()) == limits


def test_the_money_counter_sits_beside_the_subjects_tokens() -> None:
    assert cost_subject(PROJECT) == "cost:project:acme/ml/chat"
    assert is_cost_subject(cost_subject("key:k1")) and not is_cost_subject("key:k1")
