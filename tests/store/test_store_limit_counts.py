"""Counts of budgets written to the store while leading, and read back by the next leader (on SQLite
and PostgreSQL, through the store tests' fixtures)."""

from __future__ import annotations

import calendar

from llmgw.controlplane.limit_counting import LimitCounts
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry
from llmgw.store.database import Store

NOW = float(calendar.timegm((2026, 11, 30, 12, 0, 0, 0, 0, 0)))
LIMITS = {"team:acme/ml": Limits(tokens_per_day=1000), "key:k1": Limits(tokens_per_month=500)}


def limited_gateway() -> Gateway:
    gateway = Gateway()
    gateway.limiter.clock = lambda: NOW
    key = KeyEntry("k1", "k", "00", None, Place(Owner.parse("project:acme/ml/chat")))
    gateway.feed.keys_replaced([key])
    gateway.feed.limits_replaced(LIMITS)
    return gateway


def spend(gateway: Gateway, tokens: int) -> None:
    key = gateway.keys.get("k1")
    assert key is not None
    ticket = gateway.limiter.admit(key, "m")
    assert ticket is not None
    ticket.settle(tokens)
    ticket.release()


async def test_counts_written_by_one_leader_are_loaded_by_the_next(store: Store) -> None:
    first = limited_gateway()
    writer = LimitCounts(store, first.feed, lambda: NOW)
    spend(first, 120)
    assert await writer.flush() == 2
    spend(first, 30)
    assert await writer.flush() == 2
    assert await writer.flush() == 0  # nothing new

    second = limited_gateway()  # a restart, or the standby taking over
    await LimitCounts(store, second.feed, lambda: NOW).load()
    team, key = second.limiter.meter("team:acme/ml"), second.limiter.meter("key:k1")
    assert team is not None and key is not None
    assert (team.day_used, key.month_used) == (150, 150)


async def test_a_standby_writes_nothing_and_keeps_what_it_counted(store: Store) -> None:
    gateway = limited_gateway()
    leading = False
    writer = LimitCounts(store, gateway.feed, lambda: NOW, may_write=lambda: leading)
    spend(gateway, 40)
    assert await writer.flush() == 0
    assert await store.limits.spent(NOW) == {}
    leading = True
    assert await writer.flush() == 2
    assert await store.limits.spent(NOW) == {"team:acme/ml": (40, 40), "key:k1": (40, 40)}
