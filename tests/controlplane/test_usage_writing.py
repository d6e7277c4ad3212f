"""The usage writer: records summed in memory per key and model, written in batches, kept while
the store is down."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from llmgw.controlplane.accounting.usage_writing import UsageSums, UsageWriter
from llmgw.errors import StoreUnavailable
from llmgw.gateway.usage import UsageRecord
from llmgw.store.usage import UsageEntry

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Sink:
    """Stands in for the store's usage log; can refuse like a store that is down."""

    def __init__(self) -> None:
        self.batches: list[list[UsageEntry]] = []
        self.down = False

    async def append(self, entries: Sequence[UsageEntry]) -> None:
        if self.down:
            raise StoreUnavailable("the database is down", "start it")
        self.batches.append(list(entries))

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int:
        raise AssertionError("without a spill nothing is replayed")


def record(key: str = "key1", model: str = "chat", prompt: int = 5, status: int = 200) -> UsageRecord:
    return UsageRecord(
        key, model, "r1", prompt_tokens=prompt, completion_tokens=2, status=status, duration_s=0.25
    )


def writer(sink: Sink) -> UsageWriter:
    return UsageWriter(sink, lambda: NOW, interval_s=3600)


async def test_records_are_summed_into_one_row_per_key_and_model() -> None:
    sink = Sink()
    usage = writer(sink)
    usage.add(record())
    usage.add(record(prompt=7, status=499))
    usage.add(record(model="embed"))
    assert await usage.flush()
    assert sink.batches == [
        [
            UsageEntry(NOW, "key1", "chat", requests=2, failed=1, prompt_tokens=12, completion_tokens=4,
                       duration_ms=500),
            UsageEntry(NOW, "key1", "embed", requests=1, failed=0, prompt_tokens=5, completion_tokens=2,
                       duration_ms=250),
        ]
    ]  # fmt: skip
    assert usage.written == 3 and usage.pending == 0


async def test_a_flush_with_nothing_counted_writes_nothing() -> None:
    sink = Sink()
    assert await writer(sink).flush()
    assert sink.batches == []


async def test_sums_wait_while_the_store_is_down_and_are_written_after() -> None:
    sink = Sink()
    usage = writer(sink)
    usage.add(record(prompt=1))
    sink.down = True
    assert not await usage.flush()
    usage.add(record(prompt=2))
    assert usage.pending == 2
    sink.down = False
    assert await usage.flush()
    ((written,),) = sink.batches
    assert (written.requests, written.prompt_tokens) == (2, 3)


async def test_stopping_the_writer_writes_what_waits() -> None:
    sink = Sink()
    usage = writer(sink)
    running = asyncio.create_task(usage.run())
    await asyncio.sleep(0)  # let it start waiting for its interval
    usage.add(record())
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert [e.requests for batch in sink.batches for e in batch] == [1]


async def test_timings_and_places_are_summed_per_key_model_and_place() -> None:
    sink = Sink()
    usage = writer(sink)
    chat = "project:acme/ml/chat"
    usage.add(UsageRecord("key1", "chat", "r1", 5, 10, 200, 1.0, chat, ttft_s=0.2, generation_s=0.8))
    usage.add(UsageRecord("key1", "chat", "r1", 5, 20, 200, 2.0, chat, ttft_s=0.3, generation_s=1.7))
    usage.add(UsageRecord("key1", "chat", "r1", 5, 6, 200, 0.5, chat, generation_s=0.5))  # sent whole
    usage.add(
        UsageRecord("key1", "chat", "r1", 5, 0, 502, 0.4, chat, ttft_s=0.1, generation_s=0.3)
    )  # no tokens
    usage.add(UsageRecord("key1", "chat", "r1", 1, 1, 200, 0.1, "project:acme/ml/other", generation_s=0.1))
    assert await usage.flush()
    ((placed, moved),) = sink.batches
    assert (placed.place, placed.requests, placed.failed, placed.completion_tokens) == (chat, 4, 1, 36)
    assert (placed.streamed, placed.ttft_ms, placed.generation_ms) == (3, 600, 3000)
    assert (moved.place, moved.requests, moved.generation_ms) == ("project:acme/ml/other", 1, 100)


def mixed_records(n: int) -> list[UsageRecord]:
    """``n`` requests over 3 keys, 2 models and 2 places: failures, streams, answers without tokens."""
    return [
        UsageRecord(
            f"key{i % 3}",
            ("chat", "embed")[i % 2],
            "r1",
            prompt_tokens=i % 7,
            completion_tokens=i % 5,
            status=(200, 499, 502)[i % 3] if i % 4 == 0 else 200,
            duration_s=(i % 9) / 8,
            place=("project:1", "")[i % 5 == 0],
            ttft_s=(i % 3) / 16 if i % 2 else None,
            generation_s=(i % 4) / 32,
        )
        for i in range(n)
    ]


async def test_usage_summed_in_two_workers_and_sent_as_rows_is_stored_as_one_process_stores_it() -> None:
    records = mixed_records(1000)
    alone = Sink()
    one = writer(alone)
    for r in records:
        one.add(r)
    assert await one.flush()

    through = Sink()
    plane = writer(through)
    workers = [UsageSums(), UsageSums()]
    for i, r in enumerate(records):
        workers[i % 2].add(r)
        if i % 97 == 0:  # a tick: each worker sends what it summed so far, over JSON as the channel does
            for sums in workers:
                plane.add_sums(json.loads(json.dumps(sums.take())))
    for sums in workers:
        plane.add_sums(json.loads(json.dumps(sums.take())))
        assert len(sums) == 0 and sums.take() == []
    assert await plane.flush()

    assert sorted(through.batches[0], key=repr) == sorted(alone.batches[0], key=repr)
    assert sum(e.requests for e in through.batches[0]) == 1000
    assert len(through.batches[0]) == 3 * 2 * 2


async def test_a_row_that_is_not_a_sum_is_refused_with_nothing_counted() -> None:
    sink = Sink()
    usage = writer(sink)
    good = UsageSums()
    good.add(record())
    rows = good.take()
    with pytest.raises(ValueError, match="14 fields"):
        usage.add_sums([*rows, ["key1", "chat"]])
    with pytest.raises(ValueError):
        usage.add_sums([*rows, ["key1", "chat", "", "many", 0, 0, 0, 0.0, 0, 0.0, 0.0]])
    assert usage.pending == 0
    usage.add_sums(rows)
    assert usage.pending == 1


def refusal(status: int, model: str = "chat") -> UsageRecord:
    """A request of key1 no replica took, refused with ``status``."""
    return UsageRecord("key1", model, "", 0, 0, status, duration_s=0.001)


async def test_refused_requests_are_summed_apart_per_status_with_no_tokens() -> None:
    sink = Sink()
    usage = writer(sink)
    usage.add(record())
    for status in (429, 429, 400):
        usage.add(refusal(status))
    assert await usage.flush()
    by_refusal = {
        e.refused: (e.requests, e.failed, e.prompt_tokens, e.completion_tokens) for e in sink.batches[0]
    }
    assert by_refusal == {0: (1, 0, 5, 2), 429: (2, 2, 0, 0), 400: (1, 1, 0, 0)}
    assert {(e.key_id, e.model) for e in sink.batches[0]} == {("key1", "chat")}


async def test_a_workers_refusals_keep_their_status_and_a_sum_of_the_release_before_has_none() -> None:
    sink = Sink()
    usage = writer(sink)
    sums = UsageSums()
    sums.add(refusal(404, model=""))
    rows = json.loads(json.dumps(sums.take()))
    older = [["key1", "chat", "", 1, 0, 3, 2, 0.5, 0, 0.0, 0.5]]  # 11 fields: requests a replica took
    usage.add_sums([*rows, *older])
    assert await usage.flush()
    assert sorted((e.model, e.refused, e.requests, e.prompt_tokens) for e in sink.batches[0]) == [
        ("", 404, 1, 0),
        ("chat", 0, 1, 3),
    ]
