"""Usage: batches appended in one go, summed per key and model."""

from __future__ import annotations

from datetime import timedelta

from llmgw.store import Store
from llmgw.store.usage import UsageEntry, UsageLog, UsageTotal
from llmgw.testing.clock import FakeClock


def entry(clock: FakeClock, key: str, model: str, requests: int, prompt: int, completion: int) -> UsageEntry:
    return UsageEntry(clock.utcnow(), key, model, requests, 1, prompt, completion, 12)


async def test_batches_are_summed_per_key_and_model(store: Store, clock: FakeClock) -> None:
    log = UsageLog(store)
    await log.append([entry(clock, "k1", "chat", 2, 10, 3), entry(clock, "k1", "embed", 1, 7, 0)])
    await log.append([entry(clock, "k1", "chat", 3, 5, 2), entry(clock, "k2", "chat", 1, 1, 1)])
    assert await log.totals() == [
        UsageTotal("k1", "chat", 5, 2, 15, 5),
        UsageTotal("k1", "embed", 1, 1, 7, 0),
        UsageTotal("k2", "chat", 1, 1, 1, 1),
    ]


async def test_totals_since_leave_out_older_batches(store: Store, clock: FakeClock) -> None:
    log = UsageLog(store)
    await log.append([entry(clock, "k1", "chat", 1, 10, 3)])
    await clock.advance(3600)
    await log.append([entry(clock, "k1", "chat", 1, 4, 4)])
    since = clock.utcnow() - timedelta(minutes=1)
    assert await log.totals(since=since) == [UsageTotal("k1", "chat", 1, 1, 4, 4)]


async def test_an_empty_batch_writes_nothing(store: Store) -> None:
    log = UsageLog(store)
    await log.append([])
    assert await log.totals() == []
