"""The usage writer: records kept in memory, written in batches, kept while the store is down."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from llmgw.controlplane.usage_writing import UsageWriter
from llmgw.errors import StoreUnavailable
from llmgw.gateway.usage import UsageRecord
from llmgw.store.usage import UsageEntry

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WAIT = 5.0


class Sink:
    """Stands in for the store's usage log; can refuse like a store that is down."""

    def __init__(self) -> None:
        self.batches: list[list[UsageEntry]] = []
        self.down = False
        self.appended = asyncio.Event()

    async def append(self, entries: Sequence[UsageEntry]) -> None:
        if self.down:
            raise StoreUnavailable("the database is down", "start it")
        self.batches.append(list(entries))
        self.appended.set()

    @property
    def tokens(self) -> list[int]:
        return [e.prompt_tokens for batch in self.batches for e in batch]


def record(n: int) -> UsageRecord:
    return UsageRecord(
        "key1", "chat", "r1", prompt_tokens=n, completion_tokens=1, status=200, duration_s=0.25
    )


def writer(sink: Sink, **options: int) -> UsageWriter:
    return UsageWriter(sink, lambda: NOW, interval_s=3600, **options)


async def test_records_are_written_in_batches_in_order() -> None:
    sink = Sink()
    usage = writer(sink, batch=2)
    for n in range(5):
        usage.add(record(n))
    assert await usage.flush()
    assert [len(b) for b in sink.batches] == [2, 2, 1]
    assert sink.tokens == [0, 1, 2, 3, 4]
    assert sink.batches[0][0] == UsageEntry(NOW, "key1", "chat", "r1", 0, 1, 200, 250)
    assert usage.written == 5 and usage.pending == 0


async def test_records_wait_while_the_store_is_down_and_are_written_after() -> None:
    sink = Sink()
    usage = writer(sink, batch=10)
    usage.add(record(1))
    sink.down = True
    assert not await usage.flush()
    usage.add(record(2))
    sink.down = False
    assert await usage.flush()
    assert sink.tokens == [1, 2]


async def test_beyond_max_pending_the_oldest_records_are_dropped_and_counted() -> None:
    sink = Sink()
    usage = writer(sink, batch=10, max_pending=3)
    for n in range(5):
        usage.add(record(n))
    assert usage.dropped == 2
    await usage.flush()
    assert sink.tokens == [2, 3, 4]


async def test_a_full_batch_is_written_without_waiting_for_the_interval() -> None:
    sink = Sink()
    usage = writer(sink, batch=3)
    running = asyncio.create_task(usage.run())
    try:
        for n in range(3):
            usage.add(record(n))
        await asyncio.wait_for(sink.appended.wait(), WAIT)
        assert sink.tokens == [0, 1, 2]
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


async def test_stopping_the_writer_writes_what_waits() -> None:
    sink = Sink()
    usage = writer(sink, batch=100)
    running = asyncio.create_task(usage.run())
    await asyncio.sleep(0)  # let it start waiting
    usage.add(record(7))
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert sink.tokens == [7]
