"""Writing the gateway's usage to the store: summed in memory, written in batches, off the request path.

The gateway reports each request of a key through its outbound ``usage`` call;
:meth:`UsageWriter.add` only adds it to a running sum per key, model, the
key's place and, for a request no replica took, the status it was refused
with (a dictionary lookup and a few additions): requests, errors,
tokens, and the timings behind time to first token (streams) and tokens per
second (requests that made tokens). :meth:`UsageWriter.run` writes those
sums every ``interval_s`` in one INSERT, a row per key and model, however many
requests they count; no request waits.

With a :class:`~llmgw.controlplane.accounting.usage_spilling.UsageSpill` (as the control
plane runs it), memory holds at most ``max_sums`` sums: past that, and
whenever the store refuses a write, the sums go to the spill file on disk,
fsynced once per interval. The writer gives the file back to the store at
start and as soon as the store takes writes again, so a store outage and a
crash lose nothing that reached the file, and nothing is counted twice.
Without a spill, refused sums stay in memory until a write succeeds.

Gateway workers sum their records the same way (:class:`UsageSums`) and send
the sums each tick of the local channel as rows (:meth:`UsageSums.take`),
which :meth:`UsageWriter.add_sums` adds in: one line per tick and key, model
and place instead of one per request. Counts and tokens stay exact; timings
are summed as floats and stored in milliseconds, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from llmgw.controlplane.accounting.usage_spilling import UsageSpill
from llmgw.errors import LlmgwError
from llmgw.gateway.usage import UsageRecord
from llmgw.store.usage import UsageEntry

log = logging.getLogger(__name__)


class UsageSink(Protocol):
    """Where sums go: :class:`llmgw.store.usage.UsageLog`."""

    async def append(self, entries: Sequence[UsageEntry]) -> None: ...

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int: ...


class _Sum:
    __slots__ = (
        "cached",
        "completion",
        "cost",
        "duration_s",
        "failed",
        "generation_s",
        "prompt",
        "requests",
        "streamed",
        "ttft_s",
    )

    def __init__(self) -> None:
        self.requests = self.failed = self.prompt = self.completion = self.streamed = self.cached = 0
        self.duration_s = self.ttft_s = self.generation_s = self.cost = 0.0

    def merge(self, other: _Sum) -> None:
        self.requests += other.requests
        self.failed += other.failed
        self.prompt += other.prompt
        self.completion += other.completion
        self.duration_s += other.duration_s
        self.streamed += other.streamed
        self.ttft_s += other.ttft_s
        self.generation_s += other.generation_s
        self.cached += other.cached
        self.cost += other.cost


_Key = tuple[str, str, str, int]
"""A sum's key, model, place (where the key sat: usage counts there even after the key moves) and
refusal (the status its requests were refused with before any replica took them; 0: one did)."""

SumRow = list[Any]
"""A sum as a worker sends it: key, model, place, requests, failed, prompt and completion tokens,
duration (s), streamed requests, time to first token (s), generation time (s), the refusal's
status (0: none), cached prompt tokens and the cost (rows of 11 or 12 fields, from workers of
releases before, have no refusal, or no cached tokens and cost)."""

SUM_FIELDS = (11, 12, 14)
"""The lengths a sum row may have."""


def _add_record(sums: dict[_Key, _Sum], record: UsageRecord) -> None:
    key = (record.key_id, record.model, record.place, record.refused)
    total = sums.get(key)
    if total is None:
        total = sums[key] = _Sum()
    total.requests += 1
    if record.status >= 400:
        total.failed += 1
    total.prompt += record.prompt_tokens
    total.completion += record.completion_tokens
    total.cached += record.cached_tokens
    total.cost += record.cost
    total.duration_s += record.duration_s
    if record.ttft_s is not None:
        total.streamed += 1
        total.ttft_s += record.ttft_s
    if record.completion_tokens:  # tokens per second: over the time of requests that made tokens
        total.generation_s += record.generation_s


def _row(key: _Key, s: _Sum) -> SumRow:
    key_id, model, place, refused = key
    return [key_id, model, place, s.requests, s.failed, s.prompt, s.completion, s.duration_s,
            s.streamed, s.ttft_s, s.generation_s, refused, s.cached, s.cost]  # fmt: skip


def _parsed(row: SumRow) -> tuple[_Key, _Sum]:
    """A row back as a key and its sum; ValueError or TypeError when it is not one."""
    if not isinstance(row, list) or len(row) not in SUM_FIELDS:
        raise ValueError(f"a usage sum has 14 fields (11 or 12 from releases before), not {row!r}")
    key_id, model, place = (str(v) for v in row[:3])
    refused = int(row[11]) if len(row) > 11 else 0
    total = _Sum()
    total.requests, total.failed, total.prompt, total.completion = (int(v) for v in row[3:7])
    total.duration_s = float(row[7])
    total.streamed = int(row[8])
    total.ttft_s, total.generation_s = float(row[9]), float(row[10])
    if len(row) > 12:
        total.cached, total.cost = int(row[12]), float(row[13])
    return (key_id, model, place, refused), total


class UsageSums:
    """A gateway worker's usage records summed per key, model and place until the next tick sends them."""

    __slots__ = ("_sums",)

    def __init__(self) -> None:
        self._sums: dict[_Key, _Sum] = {}

    def __len__(self) -> int:
        return len(self._sums)

    def add(self, record: UsageRecord) -> None:
        """Count ``record`` (a dictionary lookup and a few additions)."""
        _add_record(self._sums, record)

    def take(self) -> list[SumRow]:
        """The sums as rows (JSON's lists), emptied."""
        sums, self._sums = self._sums, {}
        return [_row(key, s) for key, s in sums.items()]


class UsageWriter:
    """Sums usage records per key and model and writes the sums in batches."""

    def __init__(
        self,
        sink: UsageSink,
        clock: Callable[[], datetime],
        *,
        interval_s: float = 5.0,
        spill: UsageSpill | None = None,
        max_sums: int = 10_000,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self.interval_s = interval_s
        """Seconds between writes; each write holds a row per key and model used meanwhile."""
        self._sums: dict[_Key, _Sum] = {}
        self._spill = spill
        self.max_sums = max_sums
        """With a spill: the most sums (keys times models) held in memory; more go to disk."""
        self._last_at: datetime | None = None
        self.written = 0
        """Requests whose usage is stored so far."""

    @property
    def held(self) -> int:
        """Sums (one per key and model) held in memory now."""
        return len(self._sums)

    @property
    def pending(self) -> int:
        """Requests counted and not yet stored."""
        return sum(s.requests for s in self._sums.values())

    def add(self, record: UsageRecord) -> None:
        """Count ``record`` in the next write; never blocks, never raises."""
        _add_record(self._sums, record)
        if self._spill is not None and len(self._sums) >= self.max_sums:
            self._spill_sums()

    def add_sums(self, rows: list[SumRow]) -> None:
        """Count a worker's sums (:meth:`UsageSums.take`) in the next write; ValueError or TypeError,
        with nothing counted, when a row is not a sum."""
        parsed = [_parsed(row) for row in rows]
        for key, taken in parsed:
            self._sums.setdefault(key, _Sum()).merge(taken)
        if self._spill is not None and len(self._sums) >= self.max_sums:
            self._spill_sums()

    def _stamp(self) -> datetime:
        """Now, later than any entry stamped before: an entry's time, key and model name it once."""
        at = self._clock()
        if self._last_at is not None and at <= self._last_at:
            at = self._last_at + timedelta(microseconds=1)
        self._last_at = at
        return at

    def _spill_sums(self) -> None:
        """Move the sums in memory to the spill file (synced at the next flush)."""
        if self._spill is not None:
            sums, self._sums = self._sums, {}
            self._spill.write(self._entries(sums))

    def _entries(self, sums: dict[_Key, _Sum]) -> list[UsageEntry]:
        at = self._stamp()
        return [
            UsageEntry(
                at=at,
                key_id=key_id,
                model=model,
                requests=s.requests,
                failed=s.failed,
                prompt_tokens=s.prompt,
                completion_tokens=s.completion,
                duration_ms=round(s.duration_s * 1000),
                place=place,
                streamed=s.streamed,
                ttft_ms=round(s.ttft_s * 1000),
                generation_ms=round(s.generation_s * 1000),
                refused=refused,
                cached_tokens=s.cached,
                cost=s.cost,
            )
            for (key_id, model, place, refused), s in sums.items()
        ]

    async def replay(self) -> bool:
        """Give what waits in the spill file to the store; False when the store refused it."""
        if self._spill is None or not self._spill.waiting():
            return True
        try:
            await self._spill.replay(self._sink)
        except LlmgwError as error:
            log.warning("usage kept on disk waits for the store: %s", error)
            return False
        return True

    async def flush(self) -> bool:
        """Write the sums; False when the store refused them (they wait for the next flush).

        With a spill, what waits in its file is given back first, and refused sums go there.
        """
        replayed = await self.replay()
        if not self._sums:
            self._sync()
            return replayed
        sums, self._sums = self._sums, {}
        entries = self._entries(sums)
        try:
            if not replayed:
                raise LlmgwError("the store did not take the usage kept on disk")
            await self._sink.append(entries)
        except LlmgwError as error:
            if self._spill is not None:  # as stamped: had the store kept them after all, replay skips them
                self._spill.write(entries)
                self._sync()
                log.warning("usage not written, kept on disk (%s): %s", self._spill.path, error)
            else:
                self._merge_back(sums)
                log.warning("usage not written (%d requests wait): %s", self.pending, error)
            return False
        except BaseException:  # cancelled mid-write (shutdown): the final flush writes them
            self._merge_back(sums)
            raise
        self.written += sum(e.requests for e in entries)
        self._sync()
        return True

    def close(self) -> None:
        """Close the spill file (what was written to it synced)."""
        if self._spill is not None:
            self._spill.close()

    def _sync(self) -> None:
        if self._spill is not None:
            self._spill.sync()

    def _merge_back(self, sums: dict[_Key, _Sum]) -> None:
        for key, taken in sums.items():  # with what arrived meanwhile
            self._sums.setdefault(key, _Sum()).merge(taken)

    async def run(self) -> None:
        """Write every ``interval_s`` until cancelled; then write what waits once more.

        A failure other than the store's ends the run with the sums kept (the process
        supervisor runs it again); only a stop writes the last sums.
        """
        try:
            await self.replay()  # what an earlier process kept on disk
            while True:
                await asyncio.sleep(self.interval_s)
                await self.flush()
        except asyncio.CancelledError:
            if self._sums:
                await asyncio.shield(self._final_flush())
            raise

    async def _final_flush(self) -> None:
        try:
            await self.flush()
        except Exception:  # shutting down: log, never mask the cancellation
            log.exception("usage: the last sums could not be written")
