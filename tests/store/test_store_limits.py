"""Limits and the tokens spent against them, as the store keeps them."""

from __future__ import annotations

import calendar

import pytest

from llmgw.core.limits import Limits
from llmgw.errors import NotFound, ValidationFailed
from llmgw.store import Store

NOW = float(calendar.timegm((2026, 11, 30, 23, 59, 0, 0, 0, 0)))


async def test_limits_are_set_read_listed_and_removed_by_setting_none(store: Store) -> None:
    limits = Limits(requests_per_minute=60, models=frozenset({"tiny"}), expires_s=NOW)
    await store.limits.set("project:acme/ml/chat", limits)
    await store.limits.set("key:k1", Limits(concurrent=2))
    assert await store.limits.get("project:acme/ml/chat") == limits
    await store.limits.set("key:k1", Limits(concurrent=3))
    assert await store.limits.all() == {"key:k1": Limits(concurrent=3), "project:acme/ml/chat": limits}
    await store.limits.set("key:k1", Limits())
    with pytest.raises(NotFound, match="no limits are set on key:k1"):
        await store.limits.get("key:k1")


async def test_a_subject_that_is_no_key_nor_owner_is_refused(store: Store) -> None:
    with pytest.raises(ValidationFailed):
        await store.limits.set("cluster", Limits(concurrent=1))


async def test_money_spent_is_counted_beside_the_tokens_under_its_counter(store: Store) -> None:
    await store.limits.add({"org:acme": 10, "cost:org:acme": 2_500_000_000}, NOW)
    await store.limits.add({"cost:org:acme": 500_000_000}, NOW)
    assert await store.limits.spent(NOW) == {"org:acme": (10, 10), "cost:org:acme": (3_000_000_000,) * 2}


async def test_spent_tokens_add_up_across_writers_per_day_and_month(store: Store) -> None:
    await store.limits.add({"org:acme": 10, "key:k1": 3}, NOW)
    await store.limits.add({"org:acme": 5}, NOW)  # a second writer, or the next flush
    assert await store.limits.spent(NOW) == {"org:acme": (15, 15), "key:k1": (3, 3)}
    tomorrow = NOW + 120  # a new day and a new month
    await store.limits.add({"org:acme": 1}, tomorrow)
    assert await store.limits.spent(tomorrow) == {"org:acme": (1, 1)}
    assert await store.limits.forget_before(tomorrow + 40 * 86_400) == 5  # the last month stays
