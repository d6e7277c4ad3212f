"""Counts of budgets written to the store while leading, and read back by the next leader (on SQLite
and PostgreSQL, through the store tests' fixtures)."""

from __future__ import annotations

import calendar

from llmgw.controlplane.accounting.limit_counting import LimitCounts
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


async def test_a_standby_hands_its_counts_to_the_leader_whose_totals_reach_both(store: Store) -> None:
    leader, standby = limited_gateway(), limited_gateway()
    handed: list[dict[str, int]] = []
    writer = LimitCounts(store, leader.feed, lambda: NOW, hand_off=handed.append)
    follower = LimitCounts(store, standby.feed, lambda: NOW, may_write=lambda: False, hand_off=handed.append)
    spend(standby, 30)
    assert await follower.flush() == 0
    assert handed == [{"team:acme/ml": 30, "key:k1": 30}]
    assert await follower.flush() == 0 and len(handed) == 1  # handed once, not again
    writer.add(handed[0])
    spend(leader, 5)
    assert await writer.flush() == 2
    assert await store.limits.spent(NOW) == {"team:acme/ml": (35, 35), "key:k1": (35, 35)}
    told: list[dict[str, tuple[int, int]]] = []
    leader.feed.listen(lambda change, args: told.append(args[0]) if change == "limits_counted" else None)
    spend(leader, 1)
    await writer.flush()
    assert told == [{"team:acme/ml": (36, 36), "key:k1": (36, 36)}]  # the totals, streamed to standbys
    meter = leader.limiter.meter("team:acme/ml")
    assert meter is not None and meter.day_used == 36
