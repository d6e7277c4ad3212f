"""Writing the gateway's usage to the store: summed in memory, written in batches, off the request path.

The gateway reports each answered request through its ``on_usage`` hook;
:meth:`UsageWriter.add` only adds it to a running sum per key and model (a
dictionary lookup and a few additions). :meth:`UsageWriter.run` writes those
sums every ``interval_s`` in one INSERT, a row per key and model, however many
requests they count. When the store cannot take them, the sums stay and keep
growing until a write succeeds: nothing is lost, memory stays bounded by the
number of keys and models, and no request waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from llmgw.errors import LlmgwError
from llmgw.gateway.usage import UsageRecord
from llmgw.store.usage import UsageEntry

log = logging.getLogger(__name__)


class UsageSink(Protocol):
    """Where sums go: :class:`llmgw.store.usage.UsageLog`."""

    async def append(self, entries: Sequence[UsageEntry]) -> None: ...


class _Sum:
    __slots__ = ("completion", "duration_s", "failed", "prompt", "requests")

    def __init__(self) -> None:
        self.requests = self.failed = self.prompt = self.completion = 0
        self.duration_s = 0.0

    def merge(self, other: _Sum) -> None:
        self.requests += other.requests
        self.failed += other.failed
        self.prompt += other.prompt
        self.completion += other.completion
        self.duration_s += other.duration_s


class UsageWriter:
    """Sums usage records per key and model and writes the sums in batches."""

    def __init__(self, sink: UsageSink, clock: Callable[[], datetime], *, interval_s: float = 5.0) -> None:
        self._sink = sink
        self._clock = clock
        self.interval_s = interval_s
        """Seconds between writes; each write holds a row per key and model used meanwhile."""
        self._sums: dict[tuple[str, str], _Sum] = {}
        self.written = 0
        """Requests whose usage is stored so far."""

    @property
    def pending(self) -> int:
        """Requests counted and not yet stored."""
        return sum(s.requests for s in self._sums.values())

    def add(self, record: UsageRecord) -> None:
        """Count ``record`` in the next write; never blocks, never raises."""
        key = (record.key_id, record.model)
        total = self._sums.get(key)
        if total is None:
            total = self._sums[key] = _Sum()
        total.requests += 1
        if record.status >= 400:
            total.failed += 1
        total.prompt += record.prompt_tokens
        total.completion += record.completion_tokens
        total.duration_s += record.duration_s

    async def flush(self) -> bool:
        """Write the sums; False when the store refused them (they wait for the next flush)."""
        if not self._sums:
            return True
        sums, self._sums = self._sums, {}
        at = self._clock()
        entries = [
            UsageEntry(
                at=at,
                key_id=key_id,
                model=model,
                requests=s.requests,
                failed=s.failed,
                prompt_tokens=s.prompt,
                completion_tokens=s.completion,
                duration_ms=round(s.duration_s * 1000),
            )
            for (key_id, model), s in sums.items()
        ]
        try:
            await self._sink.append(entries)
        except LlmgwError as error:
            self._merge_back(sums)
            log.warning("usage not written (%d requests wait): %s", self.pending, error)
            return False
        except BaseException:  # cancelled mid-write (shutdown): the final flush writes them
            self._merge_back(sums)
            raise
        self.written += sum(e.requests for e in entries)
        return True

    def _merge_back(self, sums: dict[tuple[str, str], _Sum]) -> None:
        for key, taken in sums.items():  # with what arrived meanwhile
            self._sums.setdefault(key, _Sum()).merge(taken)

    async def run(self) -> None:
        """Write every ``interval_s`` until cancelled; then write what waits once more.

        A failure other than the store's ends the run with the sums kept (the process
        supervisor runs it again); only a stop writes the last sums.
        """
        try:
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
