"""Kept responses: what ``previous_response_id`` and ``GET /v1/responses/{id}`` read, in any process.

A response is written by whichever process answered it (leader, standby or
gateway worker) through the client store (no fence), before its answer's last
bytes leave, so a follow-up sent at once to any process finds it.

Bounds (:class:`~llmgw.core.responses.ResponseBounds`) are held in two places:

- on write, per key: the write that keeps a key's response past ``per_key``
  deletes that key's oldest in the same transaction (one indexed statement),
  so a key never holds more than its share;
- by :meth:`KeptResponseRows.sweep`, expiry and ``total``: the leader sweeps
  (a leader duty), so the request path never pays for a scan of the whole
  table and processes do not contend deleting the same rows. Reads never
  return an expired row, whether or not it was swept yet; ``total`` may be
  passed by what is written within one sweep's interval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, insert, select

from llmgw.core.responses import KeptResponse, ResponseBounds
from llmgw.store.tables import KeptResponseRow, rowcount

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from llmgw.store.access import StoreAccess

T = KeptResponseRow.__table__


class KeptResponseRows:
    """Kept responses by id, each readable by its own key, bounded by the bounds each call is given."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    def now(self) -> float:
        """The store's clock, Unix seconds: what ``kept_at`` is stamped with."""
        return self._store.now().timestamp()

    async def keep(self, kept: KeptResponse, bounds: ResponseBounds) -> None:
        """Keep ``kept`` (replacing a row of its id); the key's oldest past ``per_key`` go."""
        key_id = kept.key_id
        oldest_kept = (
            select(T.c.kept_at)
            .where(T.c.key_id == key_id)
            .order_by(T.c.kept_at.desc())
            .offset(bounds.per_key)
            .limit(1)
            .scalar_subquery()
        )
        async with self._store.session() as session:
            await session.execute(delete(T).where(T.c.id == kept.response_id))
            await session.execute(
                insert(T).values(
                    id=kept.response_id,
                    key_id=key_id,
                    kept_at=kept.kept_at,
                    response=kept.response,
                    input_items=list(kept.input_items),
                )
            )
            await session.execute(delete(T).where(and_(T.c.key_id == key_id, T.c.kept_at <= oldest_kept)))

    async def get(self, response_id: str, key_id: str, bounds: ResponseBounds) -> KeptResponse | None:
        """The response when ``key_id`` kept it less than ``ttl_s`` ago; else None."""
        since = self.now() - bounds.ttl_s
        query = select(T.c.id, T.c.key_id, T.c.kept_at, T.c.response, T.c.input_items).where(
            and_(T.c.id == response_id, T.c.key_id == key_id, T.c.kept_at >= since)
        )

        async def read(session: AsyncSession) -> Any:
            return (await session.execute(query)).first()

        row = await self._store.read(read)
        if row is None:
            return None
        return KeptResponse(row.id, row.key_id, row.response, tuple(row.input_items), row.kept_at)

    async def delete(self, response_id: str, key_id: str, bounds: ResponseBounds) -> bool:
        """Delete the response; False when ``key_id`` kept none of that id (or it expired)."""
        since = self.now() - bounds.ttl_s
        async with self._store.session() as session:
            result = await session.execute(
                delete(T).where(and_(T.c.id == response_id, T.c.key_id == key_id, T.c.kept_at >= since))
            )
        return rowcount(result) > 0

    async def sweep(self, bounds: ResponseBounds) -> int:
        """Delete the expired rows and the oldest past ``total``; how many went."""
        since = self.now() - bounds.ttl_s
        oldest_kept = (
            select(T.c.kept_at).order_by(T.c.kept_at.desc()).offset(bounds.total).limit(1).scalar_subquery()
        )
        async with self._store.session() as session:
            expired = await session.execute(delete(T).where(T.c.kept_at < since))
            over = await session.execute(delete(T).where(T.c.kept_at <= oldest_kept))
        return rowcount(expired) + rowcount(over)
