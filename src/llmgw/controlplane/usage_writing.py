"""Writing the gateway's usage to the store: in batches, off the request path.

The gateway reports each answered request through its ``on_usage`` hook;
:meth:`UsageWriter.add` only appends it to a list in memory. :meth:`UsageWriter.run`
flushes that list every ``interval_s`` (sooner once ``batch`` records wait) in one
INSERT. When the store cannot take a batch the records stay for the next flush,
up to ``max_pending``; beyond that the oldest are dropped and counted, so a store
outage never grows the control plane's memory without bound nor slows a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from llmgw.errors import LlmgwError
from llmgw.gateway.usage import UsageRecord
from llmgw.store.usage import UsageEntry

log = logging.getLogger(__name__)


class UsageSink(Protocol):
    """Where batches go: :class:`llmgw.store.usage.UsageLog`."""

    async def append(self, entries: Sequence[UsageEntry]) -> None: ...


class UsageWriter:
    """Collects usage records and writes them in batches."""

    def __init__(
        self,
        sink: UsageSink,
        clock: Callable[[], datetime],
        *,
        interval_s: float = 1.0,
        batch: int = 1000,
        max_pending: int = 100_000,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self.interval_s = interval_s
        self.batch = batch
        self._pending: deque[UsageEntry] = deque(maxlen=max_pending)
        self._full = asyncio.Event()
        self.written = 0
        """Records stored so far."""
        self.dropped = 0
        """Records lost because ``max_pending`` were already waiting (the store was down)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, record: UsageRecord) -> None:
        """Keep ``record`` for the next batch; never blocks, never raises."""
        pending = self._pending
        if len(pending) == pending.maxlen:
            self.dropped += 1
        pending.append(
            UsageEntry(
                at=self._clock(),
                key_id=record.key_id,
                model=record.model,
                replica_id=record.replica_id,
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                status=record.status,
                duration_ms=int(record.duration_s * 1000),
            )
        )
        if len(pending) >= self.batch:
            self._full.set()

    async def flush(self) -> bool:
        """Write what waits, a batch at a time; False when the store refused (the rest waits)."""
        pending = self._pending
        while pending:
            entries = [pending.popleft() for _ in range(min(self.batch, len(pending)))]
            try:
                await self._sink.append(entries)
            except LlmgwError as error:
                # Put them back in front, oldest first; what no longer fits is the oldest: dropped.
                room = (pending.maxlen or 0) - len(pending)
                keep = entries[-room:] if room > 0 else []
                self.dropped += len(entries) - len(keep)
                pending.extendleft(reversed(keep))
                log.warning("usage not written (%d records wait): %s", len(pending), error)
                return False
            self.written += len(entries)
        return True

    async def run(self) -> None:
        """Flush every ``interval_s`` or when a batch is full, until cancelled; then flush once more."""
        try:
            while True:
                try:
                    async with asyncio.timeout(self.interval_s):
                        await self._full.wait()
                except TimeoutError:
                    pass
                self._full.clear()
                await self.flush()
        finally:
            if self._pending:
                await asyncio.shield(self._final_flush())

    async def _final_flush(self) -> None:
        try:
            await self.flush()
        except Exception:  # shutting down: log, never mask the cancellation
            log.exception("usage: the last batch could not be written")
