"""What the leader is in the middle of, kept so that a new leader carries it on after a failover.

Observed state (nodes, shards, load) is rebuilt from the agents; these are
the leader's own decisions under way, which no agent reports:

- a replica **draining** (scaled down, evicted, rolled: it takes no new
  request and stops once its requests are done or its model's
  ``drain_timeout_s`` has passed, counted from ``since``);
- a model's adapter-roll **surge**, the replica a roll placed beyond the
  model's count until an old one drains in its place;
- the **rollout** of a release over the agents (``llmgw ctl upgrade agents``):
  its nodes in order, those done, the one upgrading and since when.

A drain and a surge name a replica placed (``replicas``): removing the
replica, or its model, removes them with it. These are the leader's writes:
through a fenced store (``store.fence``) a control plane that lost the lease
cannot make them.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from llmgw.store.tables import AgentRolloutRow, ModelRow, ReplicaDrainRow, ReplicaRow, RollSurgeRow
from llmgw.store.upserting import dialect_insert, upsert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

ROLLOUT_ID = 1
"""The one row of ``agent_rollout``: a rollout started replaces the last one."""

CHUNK = 500
"""Ids per ``IN (...)`` (the bound parameters one statement may take)."""


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """A replica draining: since when and why."""

    replica_id: str
    since: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """A rollout of a release over the agents, as far as it went."""

    version: str
    sums: str
    """The release's SHA256SUMS, which its signature signs."""
    signature: str
    nodes: tuple[str, ...]
    """The nodes to upgrade, in order."""
    started_at: datetime
    upgraded: tuple[str, ...] = ()
    current: str = ""
    """The node upgrading now ("" before the first, between nodes and once finished)."""
    current_since: datetime | None = None
    """When the current node was sent the release (its timeout counts from then)."""
    error: str = ""
    finished: bool = False


class LeaderState:
    """Drains begun and read back, roll surges kept and read back, the agents' rollout kept and read back."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    # drains ------------------------------------------------------------------
    async def begin_drains(self, drains: Sequence[DrainRecord]) -> builtins.list[str]:
        """Record drains begun, in one transaction; the ids of those recorded. A replica no longer
        placed is left out (it stopped already), and a drain recorded before is kept as it was."""
        if not drains:
            return []
        async with self._store.session() as session:
            placed = await _existing(session, [d.replica_id for d in drains])
            kept = [d for d in drains if d.replica_id in placed]
            if kept:
                insert = dialect_insert(session.get_bind().dialect.name, ReplicaDrainRow)
                await session.execute(
                    insert.on_conflict_do_nothing(index_elements=["replica_id"]),
                    [{"replica_id": d.replica_id, "since": d.since, "reason": d.reason} for d in kept],
                )
            return [d.replica_id for d in kept]

    async def drains(self) -> builtins.list[DrainRecord]:
        """Every replica draining, the longest-draining first."""
        query = select(ReplicaDrainRow).order_by(ReplicaDrainRow.since, ReplicaDrainRow.replica_id)

        async def read(session: AsyncSession) -> builtins.list[DrainRecord]:
            rows = (await session.scalars(query)).all()
            return [DrainRecord(row.replica_id, row.since, row.reason) for row in rows]

        return await self._store.read(read)

    # surges ------------------------------------------------------------------
    async def keep_surges(self, surges: Mapping[str, str]) -> dict[str, str]:
        """Make ``surges`` (model -> the replica its roll placed beyond its count) the whole set, in
        one transaction; the ones kept (a surge whose model or replica is gone is left out)."""
        async with self._store.session() as session:
            placed = await _existing(session, builtins.list(surges.values()))
            models: set[str] = set()
            if surges:
                named = select(ModelRow.name).where(ModelRow.name.in_(builtins.list(surges)))
                models.update(await session.scalars(named))
            kept = {m: r for m, r in surges.items() if m in models and r in placed}
            stored = {
                row.model: row.replica_id for row in (await session.scalars(select(RollSurgeRow))).all()
            }
            gone = [m for m, r in stored.items() if kept.get(m) != r]
            if gone:
                await session.execute(delete(RollSurgeRow).where(RollSurgeRow.model.in_(gone)))
            for model, replica_id in kept.items():
                if stored.get(model) != replica_id:
                    session.add(RollSurgeRow(model=model, replica_id=replica_id))
            return kept

    async def surges(self) -> dict[str, str]:
        """Each model's roll surge: model -> replica id."""

        async def read(session: AsyncSession) -> dict[str, str]:
            return {row.model: row.replica_id for row in (await session.scalars(select(RollSurgeRow))).all()}

        return await self._store.read(read)

    # the agents' rollout -----------------------------------------------------
    async def keep_rollout(self, rollout: RolloutRecord) -> None:
        """Record the rollout as it stands now (a new one replaces the last)."""
        values = {
            "id": ROLLOUT_ID,
            "version": rollout.version,
            "sums": rollout.sums,
            "signature": rollout.signature,
            "nodes": builtins.list(rollout.nodes),
            "upgraded": builtins.list(rollout.upgraded),
            "current": rollout.current,
            "current_since": rollout.current_since,
            "error": rollout.error,
            "finished": rollout.finished,
            "started_at": rollout.started_at,
            "updated_at": self._store.now(),
        }
        async with self._store.session() as session:
            await upsert(session, AgentRolloutRow, values, key="id", update=[k for k in values if k != "id"])

    async def rollout(self) -> RolloutRecord | None:
        """The last rollout recorded; None when none was ever started."""

        async def read(session: AsyncSession) -> RolloutRecord | None:
            row = await session.get(AgentRolloutRow, ROLLOUT_ID)
            if row is None:
                return None
            return RolloutRecord(
                version=row.version,
                sums=row.sums,
                signature=row.signature,
                nodes=tuple(row.nodes),
                started_at=row.started_at,
                upgraded=tuple(row.upgraded),
                current=row.current,
                current_since=row.current_since,
                error=row.error,
                finished=row.finished,
            )

        return await self._store.read(read)


async def _existing(session: AsyncSession, replica_ids: builtins.list[str]) -> set[str]:
    """Which of ``replica_ids`` are placed (have a row in ``replicas``)."""
    found: set[str] = set()
    unique = sorted(set(replica_ids))
    for start in range(0, len(unique), CHUNK):
        chunk = unique[start : start + CHUNK]
        found.update(await session.scalars(select(ReplicaRow.id).where(ReplicaRow.id.in_(chunk))))
    return found
