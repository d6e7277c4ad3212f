"""Usage: requests and tokens per key and model, appended in batches, summed on reading.

The gateway never writes here itself: the control plane's usage writer sums
its records in memory and hands over one :class:`UsageEntry` per key and model
each flush, in one :meth:`UsageLog.append`. A row covers the time since the
flush before it (``at`` is when it was written), so rows stay few however many
requests there are.

Requests no replica took (refused by a check, a limit, or for want of a
replica) have entries of their own, one per status they were refused with
(``refused``), and no tokens.

Sums kept on the control plane's disk while the store was away come back
through :meth:`UsageLog.append_missing`: an entry's ``at``, key, model and
refusal name it (the writer never stamps two entries of a key, model and
refusal with one ``at``), so an entry already stored is never stored twice.

Each row keeps what its requests cost (``cost``, in the cluster's currency,
:mod:`llmgw.core.pricing`), worked out by the gateway at the prices in force
when each request ended: a price changed later leaves it as it was.

Each row keeps the key's place as it was when the requests were made (its
project, or its user), with the place's team and organization, so usage
counts where it was spent after a key moves or goes. Reading it summed over
time buckets and groups is :mod:`llmgw.store.usagereports`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, insert, select

from llmgw.core.tenancy import Owner, OwnerKind
from llmgw.store.tables import UsageRow

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """What one key used of one model over one flush interval."""

    at: datetime
    """When the interval ended (the entry was written)."""
    key_id: str
    model: str
    requests: int
    failed: int
    """Requests answered with an error, or that the client left (status 400 and above)."""
    prompt_tokens: int
    completion_tokens: int
    duration_ms: int
    """The requests' durations, summed."""
    place: str = ""
    """Where the key sat (``project:ORG/TEAM/PROJECT``, ``user:NAME``; empty: nowhere)."""
    streamed: int = 0
    """Requests whose time to first token was measured (streamed answers)."""
    ttft_ms: int = 0
    """Their times to first token, summed."""
    generation_ms: int = 0
    """Time spent generating ``completion_tokens``, summed."""
    refused: int = 0
    """The status these requests were refused with before any replica took them (400, 404, 429,
    503 …); 0: requests a replica took."""
    cached_tokens: int = 0
    """Prompt tokens the engine found in its cache (of ``prompt_tokens``)."""
    cost: float = 0.0
    """What the requests cost, at the prices in force when each ended (the cluster's currency)."""


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """What one key used of one model, over the time asked about."""

    key_id: str
    model: str
    requests: int
    failed: int
    prompt_tokens: int
    completion_tokens: int


class UsageLog:
    """Append usage in batches; read back totals."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def append(self, entries: Sequence[UsageEntry]) -> None:
        """Store ``entries`` in one statement and one transaction."""
        if not entries:
            return
        async with self._store.session() as session:
            await session.execute(insert(UsageRow), _rows(entries))

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int:
        """Store the ``entries`` not stored yet (by ``at``, key and model), in one transaction; how many."""
        if not entries:
            return 0
        async with self._store.session() as session:
            query = select(UsageRow.at, UsageRow.key_id, UsageRow.model, UsageRow.refused).where(
                UsageRow.at.in_(sorted({e.at for e in entries}))
            )
            stored = {tuple(row) for row in await session.execute(query)}
            missing = [e for e in entries if (e.at, e.key_id, e.model, e.refused) not in stored]
            if missing:
                await session.execute(insert(UsageRow), _rows(missing))
        return len(missing)

    async def totals(self, since: datetime | None = None) -> list[UsageTotal]:
        """Requests and tokens per key and model (written since ``since`` when given), by key then model."""
        query = select(
            UsageRow.key_id,
            UsageRow.model,
            func.sum(UsageRow.requests),
            func.sum(UsageRow.failed),
            func.sum(UsageRow.prompt_tokens),
            func.sum(UsageRow.completion_tokens),
        ).group_by(UsageRow.key_id, UsageRow.model)
        if since is not None:
            query = query.where(UsageRow.at >= since)
        query = query.order_by(UsageRow.key_id, UsageRow.model)
        async with self._store.session() as session:
            return [
                UsageTotal(key_id, model, int(requests), int(failed), int(prompt), int(completion))
                for key_id, model, requests, failed, prompt, completion in await session.execute(query)
            ]


def _rows(entries: Sequence[UsageEntry]) -> list[dict[str, object]]:
    return [
        {
            "at": e.at,
            "key_id": e.key_id,
            "model": e.model,
            "requests": e.requests,
            "failed": e.failed,
            "prompt_tokens": e.prompt_tokens,
            "completion_tokens": e.completion_tokens,
            "duration_ms": e.duration_ms,
            **placed(e.place),
            "streamed": e.streamed,
            "ttft_ms": e.ttft_ms,
            "generation_ms": e.generation_ms,
            "refused": e.refused,
            "cached_tokens": e.cached_tokens,
            "cost": e.cost,
        }
        for e in entries
    ]


def placed(place: str) -> dict[str, str]:
    """The ``place``, ``team`` and ``org`` columns of a row for a key at ``place`` (text of an owner).

    A text that names no owner counts nowhere rather than failing the batch it is in.
    """
    try:
        owner = Owner.parse(place)
    except ValueError:
        return {"place": "", "team": "", "org": ""}
    chain = {o.kind: str(o) for o in owner.lineage()}
    return {"place": str(owner), "team": chain.get(OwnerKind.TEAM, ""), "org": chain.get(OwnerKind.ORG, "")}
