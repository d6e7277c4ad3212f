"""The arithmetic of limits: buckets, budgets rolling over, the first refusal of a chain."""

from __future__ import annotations

import calendar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.limits import DAY_S, Limits, Meter, admit, month_of, next_month_s, priority_of, subject_text

T0 = float(calendar.timegm((2026, 11, 30, 12, 0, 0, 0, 0, 0)))


@given(
    rpm=st.integers(1, 600),
    gaps=st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=200),
)
def test_admitted_requests_never_exceed_the_burst_plus_the_refill(rpm: int, gaps: list[float]) -> None:
    meter = Meter("project:a/b/c", Limits(requests_per_minute=rpm), T0)
    now, admitted = T0, 0
    for gap in gaps:
        now += gap
        if admit([meter], "m", now) is None:
            admitted += 1
            meter.concurrent -= 1
    assert admitted <= rpm + (now - T0) * rpm / 60 + 1e-9


@given(rpm=st.integers(1, 100))
def test_a_full_bucket_admits_exactly_its_limit_at_once(rpm: int) -> None:
    meter = Meter("key:k", Limits(requests_per_minute=rpm), T0)
    results = [admit([meter], "m", T0) for _ in range(rpm + 1)]
    assert all(r is None for r in results[:-1])
    refusal = results[-1]
    assert refusal is not None and refusal.limit == "requests_per_minute"
    assert refusal.retry_after_s == pytest.approx(60 / rpm)


def test_a_refused_request_takes_nothing_from_the_meters_before_the_refusing_one() -> None:
    key = Meter("key:k", Limits(requests_per_minute=10), T0)
    team = Meter("team:a/b", Limits(concurrent=0), T0)
    refusal = admit([key, team], "m", T0)
    assert refusal is not None and refusal.subject == "team:a/b" and refusal.limit == "concurrent"
    assert key.concurrent == 0 and key.requests is not None and key.requests.level == 10


def test_tokens_per_minute_refuse_once_spent_below_zero_and_refill() -> None:
    meter = Meter("org:a", Limits(tokens_per_minute=600), T0)
    meter.spend(700, T0)
    refusal = meter.check("m", T0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(10.1)
    assert meter.check("m", T0 + 10.1) is None


def test_a_days_budget_starts_again_the_next_utc_day() -> None:
    meter = Meter("org:a", Limits(tokens_per_day=100), T0)
    meter.spend(100, T0)
    refusal = meter.check("m", T0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(12 * 3600)
    assert meter.check("m", T0 + DAY_S / 2) is None
    assert meter.day_used == 0


def test_a_months_budget_lasts_until_the_next_month() -> None:
    meter = Meter("org:a", Limits(tokens_per_month=100), T0)
    meter.spend(100, T0)
    refusal = meter.check("m", T0 + DAY_S / 4)
    assert refusal is not None
    assert next_month_s(month_of(T0)) == calendar.timegm((2026, 12, 1, 0, 0, 0, 0, 0, 0))
    assert meter.check("m", T0 + DAY_S / 2) is None


def test_a_share_holds_its_part_of_each_limit() -> None:
    meter = Meter("org:a", Limits(requests_per_minute=100, concurrent=10), T0, share=0.25)
    assert meter.requests is not None and meter.requests.capacity == 25
    for _ in range(2):
        meter.take_request()
    meter.concurrent = 3
    assert meter.check("m", T0) is not None


def test_a_share_smaller_than_one_request_still_admits_one_and_refills_at_its_share() -> None:
    meter = Meter("key:k", Limits(requests_per_minute=1), T0, share=0.5)
    assert admit([meter], "m", T0) is None
    meter.concurrent = 0
    refusal = admit([meter], "m", T0 + 1)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(119, abs=1)  # 0.5 a minute
    assert admit([meter], "m", T0 + 121) is None


def test_a_new_share_keeps_how_full_each_plane_s_bucket_was_so_the_planes_still_admit_the_limit() -> None:
    limits = Limits(requests_per_minute=20)
    planes = [Meter("project:a/b/c", limits, T0, share=0.5) for _ in range(2)]
    planes[1].take_request()  # 10 and 9 left: 19 in all
    planes[0].set_limits(limits, T0, share=0.4)  # the leader re-divides by use
    planes[1].set_limits(limits, T0, share=0.6)
    levels = [meter.requests.level for meter in planes if meter.requests is not None]
    assert levels == [pytest.approx(8.0), pytest.approx(10.8)]
    assert sum(levels) == pytest.approx(18.8)  # not 10 capped to 8 plus 9 unchanged: 17


def test_new_limits_keep_the_counts() -> None:
    meter = Meter("org:a", Limits(requests_per_minute=10), T0)
    admit([meter], "m", T0)
    meter.spend(5, T0)
    meter.set_limits(Limits(requests_per_minute=5, tokens_per_day=6), T0)
    assert meter.requests is not None and meter.requests.level == 5
    assert meter.day_used == 5 and meter.concurrent == 1


def test_limits_round_trip_and_refuse_unknown_fields() -> None:
    limits = Limits(requests_per_minute=5, models=frozenset({"a", "b"}))
    assert Limits.from_dict(limits.as_dict()) == limits
    with pytest.raises(ValueError, match="unknown limits"):
        Limits.from_dict({"rpm": 5})
    with pytest.raises(ValueError, match="0 or more"):
        Limits(concurrent=-1)


def test_subjects_are_keys_or_owners_below_the_cluster() -> None:
    assert subject_text(" team:acme/ml ") == "team:acme/ml"
    assert subject_text("key:abc-1") == "key:abc-1"
    with pytest.raises(ValueError, match="not the cluster"):
        subject_text("")
    with pytest.raises(ValueError, match="key id"):
        subject_text("key:")


def test_a_priority_is_a_whole_number_from_0_to_9_and_needs_no_meter() -> None:
    for bad in (-1, 10, 2.5, True):
        with pytest.raises(ValueError, match="priority must be a whole number from 0"):
            Limits(priority=bad)  # type: ignore[arg-type]
    only = Limits(priority=7)
    assert not only.empty and not only.metered and Limits(priority=7, concurrent=2).metered
    assert Limits.from_dict(only.as_dict()) == only


@given(
    st.one_of(st.none(), st.integers(0, 9)),
    st.lists(st.one_of(st.none(), st.integers(0, 9)), max_size=3),
)
def test_a_keys_priority_may_lower_its_owners_never_raise_it(
    own: int | None, owners: list[int | None]
) -> None:
    got = priority_of(Limits(priority=own), [Limits(priority=p) for p in owners])
    cap = min((p for p in owners if p is not None), default=5)
    assert got <= cap and got == (cap if own is None else min(own, cap))
    assert priority_of(None, []) == 5
