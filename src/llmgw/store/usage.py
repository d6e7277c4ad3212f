"""Usage: one row per answered ``/v1`` request, appended in batches, summed per key and model.

The gateway never writes here itself: the control plane's usage writer
collects its records in memory and hands them over in one :meth:`UsageLog.append`
per batch, a single INSERT of many rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, insert, select

from llmgw.store.tables import UsageRow

if TYPE_CHECKING:
    from llmgw.store.database import Store


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """One request's use of a replica, as stored."""

    at: datetime
    """When the request ended."""
    key_id: str
    model: str
    replica_id: str
    prompt_tokens: int
    completion_tokens: int
    status: int
    """The HTTP status answered (499: the client went away first)."""
    duration_ms: int


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """What one key used of one model."""

    key_id: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


class UsageLog:
    """Append usage in batches; read back totals."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def append(self, entries: Sequence[UsageEntry]) -> None:
        """Store ``entries`` in one statement and one transaction."""
        if not entries:
            return
        rows = [
            {
                "at": e.at,
                "key_id": e.key_id,
                "model": e.model,
                "replica_id": e.replica_id,
                "prompt_tokens": e.prompt_tokens,
                "completion_tokens": e.completion_tokens,
                "status": e.status,
                "duration_ms": e.duration_ms,
            }
            for e in entries
        ]
        async with self._store.session() as session:
            await session.execute(insert(UsageRow), rows)

    async def totals(self, since: datetime | None = None) -> list[UsageTotal]:
        """Requests and tokens per key and model (since ``since`` when given), by key then model."""
        query = select(
            UsageRow.key_id,
            UsageRow.model,
            func.count(),
            func.coalesce(func.sum(UsageRow.prompt_tokens), 0),
            func.coalesce(func.sum(UsageRow.completion_tokens), 0),
        ).group_by(UsageRow.key_id, UsageRow.model)
        if since is not None:
            query = query.where(UsageRow.at >= since)
        query = query.order_by(UsageRow.key_id, UsageRow.model)
        async with self._store.session() as session:
            return [
                UsageTotal(key_id, model, int(count), int(prompt), int(completion))
                for key_id, model, count, prompt, completion in await session.execute(query)
            ]
