"""Usage through a store outage: bounded in memory, kept on disk, given back once, also after a crash."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from llmgw.controlplane.accounting.usage_spilling import REPLAY_CHUNK, REPLAYING_FILE, UsageSpill
from llmgw.controlplane.accounting.usage_writing import UsageWriter
from llmgw.errors import StoreUnavailable
from llmgw.gateway.usage import UsageRecord
from llmgw.store.database import Store
from llmgw.store.usage import UsageEntry, UsageLog
from llmgw.testing.clock import FakeClock

MAX_SUMS = 50
KEYS = 300
MODELS = ("chat", "embed")


class CuttableLog:
    """The store's usage log behind a switch: while ``down`` it answers as an unreachable store.

    ``fail_after_chunks``: replay stores that many chunks, then the store goes away (a death mid-replay).
    ``lose_answer``: the next append is stored and then reported failed (the answer lost on the way).
    """

    def __init__(self, log: UsageLog) -> None:
        self.log = log
        self.down = False
        self.fail_after_chunks: int | None = None
        self.lose_answer = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("the database is down", "start it")

    async def append(self, entries: Sequence[UsageEntry]) -> None:
        self._check()
        await self.log.append(entries)
        if self.lose_answer:
            self.lose_answer = False
            raise StoreUnavailable("the connection dropped after the commit", "try again")

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int:
        self._check()
        if self.fail_after_chunks is not None:
            if self.fail_after_chunks == 0:
                raise StoreUnavailable("the database went away mid-replay", "start it")
            self.fail_after_chunks -= 1
        return await self.log.append_missing(entries)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    yield opened
    await opened.close()


def writer(sink: CuttableLog, clock: FakeClock, directory: Path) -> UsageWriter:
    return UsageWriter(sink, clock.utcnow, interval_s=5.0, spill=UsageSpill(directory), max_sums=MAX_SUMS)


def record(i: int) -> UsageRecord:
    return UsageRecord(
        f"key{i % KEYS}",
        MODELS[i % 2],
        "r1",
        prompt_tokens=i % 7,
        completion_tokens=3,
        status=200,
        duration_s=0.1,
    )


def expected(records: range) -> dict[tuple[str, str], tuple[int, int]]:
    requests: Counter[tuple[str, str]] = Counter()
    prompt: Counter[tuple[str, str]] = Counter()
    for i in records:
        r = record(i)
        requests[r.key_id, r.model] += 1
        prompt[r.key_id, r.model] += r.prompt_tokens
    return {key: (requests[key], prompt[key]) for key in requests}


async def stored(store: Store) -> dict[tuple[str, str], tuple[int, int]]:
    return {(t.key_id, t.model): (t.requests, t.prompt_tokens) for t in await UsageLog(store).totals()}


async def test_a_60_s_outage_loses_nothing_doubles_nothing_and_memory_stays_bounded(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock()
    sink = CuttableLog(UsageLog(store))
    usage = writer(sink, clock, tmp_path)
    records = range(10_000)
    per_tick = 500  # 20 ticks of 5 s: 2 before the outage, 12 during it (60 s), 6 after
    most_held = 0
    for tick in range(20):
        sink.down = 2 <= tick < 14
        for i in records[tick * per_tick : (tick + 1) * per_tick]:
            usage.add(record(i))
            most_held = max(most_held, usage.held)
        await clock.advance(5.0)
        assert await usage.flush() is not sink.down
        if sink.down:
            assert usage.held == 0 and usage.pending == 0  # all of it on disk, synced
    assert most_held <= MAX_SUMS
    assert await stored(store) == expected(records)
    assert not (tmp_path / REPLAYING_FILE).exists() and not UsageSpill(tmp_path).waiting()


async def test_usage_kept_on_disk_before_a_crash_is_stored_at_the_next_start(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock()
    sink = CuttableLog(UsageLog(store))
    sink.down = True
    first = writer(sink, clock, tmp_path)
    for i in range(2_000):
        first.add(record(i))
    assert not await first.flush()  # synced to disk; then the process dies without closing anything
    sink.down = False
    assert await writer(sink, clock, tmp_path).replay()
    assert await stored(store) == expected(range(2_000))


async def test_a_death_mid_replay_counts_nothing_twice(store: Store, tmp_path: Path) -> None:
    clock = FakeClock()
    sink = CuttableLog(UsageLog(store))
    sink.down = True
    first = writer(sink, clock, tmp_path)
    for i in range(3 * REPLAY_CHUNK * 2):
        first.add(record(i))
    assert not await first.flush()
    sink.down = False
    sink.fail_after_chunks = 1  # one chunk stored, then the store goes: the file stays for the next start
    assert not await first.replay()
    assert (tmp_path / REPLAYING_FILE).exists()
    sink.fail_after_chunks = None
    assert await writer(sink, clock, tmp_path).replay()  # the next process replays the whole file
    assert await stored(store) == expected(range(3 * REPLAY_CHUNK * 2))


async def test_a_write_the_store_kept_but_answered_as_failed_is_not_counted_twice(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock()
    sink = CuttableLog(UsageLog(store))
    usage = writer(sink, clock, tmp_path)
    for i in range(40):
        usage.add(record(i))
    sink.lose_answer = True
    assert not await usage.flush()
    await clock.advance(5.0)
    assert await usage.flush()
    assert await stored(store) == expected(range(40))


async def test_a_line_cut_short_by_a_crash_is_left_out_and_the_rest_stored(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock()
    sink = CuttableLog(UsageLog(store))
    sink.down = True
    usage = writer(sink, clock, tmp_path)
    for i in range(10):
        usage.add(record(i))
    assert not await usage.flush()
    usage.close()
    with (tmp_path / "usage-spill.jsonl").open("a") as spill:
        spill.write('{"at": "2026-01-01T00:00:00+00:00", "key_id": "key')
    sink.down = False
    assert await writer(sink, clock, tmp_path).replay()
    assert await stored(store) == expected(range(10))


class Collected:
    def __init__(self) -> None:
        self.entries: list[UsageEntry] = []

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int:
        self.entries += entries
        return len(entries)


async def test_places_timings_refusals_and_costs_survive_the_spill_file(tmp_path: Path) -> None:
    clock = FakeClock()
    spilled = UsageEntry(
        clock.utcnow(),
        "k1",
        "chat",
        2,
        0,
        3,
        4,
        5,
        "project:acme/ml/chat",
        streamed=1,
        ttft_ms=6,
        generation_ms=7,
        cached_tokens=2,
        cost=0.0125,
    )
    refused = UsageEntry(clock.utcnow(), "k1", "chat", 1, 1, 0, 0, 1, "", refused=429)
    spill = UsageSpill(tmp_path)
    spill.write([spilled, refused])
    spill.close()
    sink = Collected()
    await spill.replay(sink)
    assert sink.entries == [spilled, refused]


async def test_a_line_spilled_before_places_were_kept_counts_nowhere_without_timings(tmp_path: Path) -> None:
    (tmp_path / "usage-spill.jsonl").write_text(
        '{"at":"2026-01-01T00:00:00+00:00","key_id":"k1","model":"chat","requests":1,"failed":0,'
        '"prompt_tokens":2,"completion_tokens":3,"duration_ms":4}\n'
    )
    sink = Collected()
    await UsageSpill(tmp_path).replay(sink)
    ((entry,),) = [sink.entries]
    assert (entry.key_id, entry.place, entry.streamed, entry.ttft_ms, entry.generation_ms) == (
        "k1",
        "",
        0,
        0,
        0,
    )
