"""Recording nodes' registrations in the store, many in one transaction.

Each registration is remembered in the store (``/api/nodes`` lists nodes once
seen, the firewall allows their addresses). A new leader that a thousand nodes
register with in a few seconds would write a thousand transactions, each
waiting for one of the store's few connections, and its own lease renewal would
queue behind them (the benchmark saw a leader lose its lease so). Instead one
writer takes every registration waiting and writes them in one transaction;
what arrives meanwhile goes in the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from llmgw.errors import LlmgwError
from llmgw.store.database import Store

log = logging.getLogger(__name__)


class NodeRecords:
    """Writes nodes' registrations to the store in batches, one writer at a time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._waiting: dict[str, tuple[str, dict[str, Any]]] = {}
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0
        """Transactions written, for the tests and the benchmark."""

    def record(self, node_id: str, address: str, inventory: dict[str, Any]) -> None:
        """Record that ``node_id`` registered now (written soon; the latest registration of a node wins)."""
        self._waiting[node_id] = (address, inventory)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="node-records")

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, {}
            try:
                await self._store.nodes.upsert_many(
                    [(node_id, address, inventory) for node_id, (address, inventory) in batch.items()]
                )
                self.batches += 1
            except LlmgwError as error:
                log.warning(
                    "could not record %d node(s) in the store (%s): %s",
                    len(batch),
                    ", ".join(sorted(batch)[:5]) + (", …" if len(batch) > 5 else ""),
                    error,
                )

    async def flushed(self) -> None:
        """Wait until every registration recorded so far is written (or failed)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
