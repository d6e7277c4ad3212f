"""Kept responses: what ``previous_response_id`` and ``/v1/responses/{id}`` read, in any process.

A response is written by whichever process answered it (the leader, a
standby or a gateway worker) through the client store (no fence), before its
answer's last bytes leave, so a follow-up sent at once to any process finds
it. Each is readable and deletable by the key that made it only.

Bounds, held where they cost the request path least:

- on write (:meth:`Responses.keep`, one transaction): the key's oldest past
  ``per_key`` go, and expired rows, at most :data:`TRIMMED_PER_KEEP` of
  each, so a keep costs the same however large the table is;
- by :meth:`Responses.sweep`, a leader duty: every expired row, and the
  oldest past ``total`` in all (by expiry: with one ``ttl_s`` the same
  order), so the request path never pays for a walk of the whole table and
  ``total`` may be passed by what is written between two sweeps.

A read never returns an expired row, swept or not.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Table, delete, func, or_, select

from llmgw.store.tables import KeptResponseRow, rowcount
from llmgw.store.upserting import dialect_insert

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from llmgw.store.access import StoreAccess

T = cast(Table, KeptResponseRow.__table__)
"""The table, written with core statements (no ORM objects on the request path)."""

TRIMMED_PER_KEEP = 16
"""Most rows a keep deletes of each kind (its key's oldest past ``per_key``, expired ones)."""
SWEPT_PER_STATEMENT = 1000
"""Rows one statement of a sweep deletes at most (it runs until none is left)."""

_COLUMNS = (
    T.c.response_id,
    T.c.key_id,
    T.c.input_items,
    T.c.output_items,
    T.c.response,
    T.c.kept_at,
    T.c.expires_at,
)


@dataclass(frozen=True, slots=True)
class KeptRecord:
    """A kept response as the store holds it."""

    response_id: str
    key_id: str
    input_items: builtins.list[dict[str, Any]]
    output_items: builtins.list[dict[str, Any]]
    response: dict[str, Any]
    kept_at: datetime
    expires_at: datetime


class Responses:
    """Kept responses by id, each of one key: keep, read, delete, and the leader's sweep."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def keep(
        self,
        response_id: str,
        key_id: str,
        input_items: builtins.list[dict[str, Any]],
        output_items: builtins.list[dict[str, Any]],
        response: dict[str, Any],
        *,
        ttl_s: float,
        per_key: int,
    ) -> None:
        """Keep a response of ``key_id`` for ``ttl_s`` (replacing a row of its id); in the same
        transaction the key's oldest past ``per_key`` and some expired rows go."""
        now = self._store.now()
        values = {
            "response_id": response_id,
            "key_id": key_id,
            "input_items": input_items,
            "output_items": output_items,
            "response": response,
            "kept_at": now,
            "expires_at": now + timedelta(seconds=ttl_s),
        }
        over = (
            select(T.c.response_id)
            .where(T.c.key_id == key_id)
            .order_by(T.c.kept_at.desc(), T.c.response_id.desc())
            .offset(per_key)
            .limit(TRIMMED_PER_KEEP)
        )
        expired = (
            select(T.c.response_id)
            .where(T.c.expires_at <= now)
            .order_by(T.c.expires_at)
            .limit(TRIMMED_PER_KEEP)
        )
        async with self._store.session() as session:
            insert = dialect_insert(session.get_bind().dialect.name, KeptResponseRow).values(values)
            replace = {name: insert.excluded[name] for name in values if name != "response_id"}
            await session.execute(insert.on_conflict_do_update(index_elements=["response_id"], set_=replace))
            await session.execute(
                delete(T).where(or_(T.c.response_id.in_(over), T.c.response_id.in_(expired)))
            )

    async def get(self, response_id: str, key_id: str) -> KeptRecord | None:
        """The response when ``key_id`` kept it and it has not expired; else None."""
        query = select(*_COLUMNS).where(
            T.c.response_id == response_id, T.c.key_id == key_id, T.c.expires_at > self._store.now()
        )

        async def read(session: AsyncSession) -> KeptRecord | None:
            row = (await session.execute(query)).first()
            if row is None:
                return None
            return KeptRecord(
                row.response_id,
                row.key_id,
                list(row.input_items),
                list(row.output_items),
                dict(row.response),
                row.kept_at,
                row.expires_at,
            )

        return await self._store.read(read)

    async def delete(self, response_id: str, key_id: str) -> bool:
        """Delete the response; False when ``key_id`` kept none of that id (or it expired)."""
        statement = delete(T).where(
            T.c.response_id == response_id, T.c.key_id == key_id, T.c.expires_at > self._store.now()
        )
        async with self._store.session() as session:
            return rowcount(await session.execute(statement)) > 0

    async def sweep(self, total: int) -> int:
        """Delete every expired row, then the oldest past ``total``; how many went."""
        now = self._store.now()
        expired = (
            select(T.c.response_id)
            .where(T.c.expires_at <= now)
            .order_by(T.c.expires_at)
            .limit(SWEPT_PER_STATEMENT)
        )
        over = (
            select(T.c.response_id)
            .order_by(T.c.expires_at.desc(), T.c.response_id.desc())
            .offset(total)
            .limit(SWEPT_PER_STATEMENT)
        )
        swept = 0
        for chosen in (expired, over):
            while True:
                async with self._store.session() as session:
                    gone = rowcount(await session.execute(delete(T).where(T.c.response_id.in_(chosen))))
                swept += gone
                if gone < SWEPT_PER_STATEMENT:
                    break
        return swept

    async def count(self) -> int:
        """How many rows the table holds, expired ones included."""

        async def read(session: AsyncSession) -> int:
            return int(await session.scalar(select(func.count()).select_from(T)) or 0)

        return await self._store.read(read)
