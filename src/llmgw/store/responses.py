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

from sqlalchemy import Insert, Table, bindparam, delete, func, or_, select

from llmgw.store.clienttables import KeptResponseRow
from llmgw.store.tables import rowcount
from llmgw.store.upserting import dialect_insert

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from llmgw.store.access import Executes, StoreAccess

T = cast(Table, KeptResponseRow.__table__)
"""The table, written with core statements built once (no ORM objects on the request path)."""

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
_REPLACED = ("key_id", "input_items", "output_items", "response", "kept_at", "expires_at")

_TRIM = delete(T).where(
    or_(
        T.c.response_id.in_(
            select(T.c.response_id)
            .where(T.c.key_id == bindparam("key_id"))
            .order_by(T.c.kept_at.desc())  # the index's order: no sort of the key's rows
            .offset(bindparam("per_key"))
            .limit(TRIMMED_PER_KEEP)
        ),
        T.c.response_id.in_(
            select(T.c.response_id)
            .where(T.c.expires_at <= bindparam("now"))
            .order_by(T.c.expires_at)
            .limit(TRIMMED_PER_KEEP)
        ),
    )
)
"""A keep's trims: the key's oldest past ``per_key`` and some expired rows."""
_GET = select(*_COLUMNS).where(
    T.c.response_id == bindparam("response_id"),
    T.c.key_id == bindparam("key_id"),
    T.c.expires_at > bindparam("now"),
)
_DELETE = delete(T).where(
    T.c.response_id == bindparam("response_id"),
    T.c.key_id == bindparam("key_id"),
    T.c.expires_at > bindparam("now"),
)


def _upsert(dialect: str) -> Insert:
    """Insert a row, or replace every column of the row of its id."""
    insert = dialect_insert(dialect, KeptResponseRow)
    return insert.on_conflict_do_update(
        index_elements=["response_id"], set_={name: insert.excluded[name] for name in _REPLACED}
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
    """Kept responses by id, each of one key: keep, read, delete, and the leader's sweep.

    A keep, a read and a delete each are one :meth:`~llmgw.store.access.StoreAccess.transact`:
    they are on the request path."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store
        self._upsert: Insert | None = None

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
        if self._upsert is None:
            self._upsert = _upsert(self._store.url.get_backend_name())
        upsert = self._upsert
        now = self._store.now()
        row = {
            "response_id": response_id,
            "key_id": key_id,
            "input_items": input_items,
            "output_items": output_items,
            "response": response,
            "kept_at": now,
            "expires_at": now + timedelta(seconds=ttl_s),
        }
        trims = {"key_id": key_id, "per_key": per_key, "now": now}

        def work(db: Executes) -> None:
            db.execute(upsert, row)
            db.execute(_TRIM, trims)

        await self._store.transact(work)

    async def get(self, response_id: str, key_id: str) -> KeptRecord | None:
        """The response when ``key_id`` kept it and it has not expired; else None."""
        asked = {"response_id": response_id, "key_id": key_id, "now": self._store.now()}

        def work(db: Executes) -> KeptRecord | None:
            found = db.execute(_GET, asked).first()
            if found is None:
                return None
            return KeptRecord(
                found.response_id,
                found.key_id,
                list(found.input_items),
                list(found.output_items),
                dict(found.response),
                found.kept_at,
                found.expires_at,
            )

        return await self._store.transact(work)

    async def delete(self, response_id: str, key_id: str) -> bool:
        """Delete the response; False when ``key_id`` kept none of that id (or it expired)."""
        asked = {"response_id": response_id, "key_id": key_id, "now": self._store.now()}

        def work(db: Executes) -> bool:
            return rowcount(db.execute(_DELETE, asked)) > 0

        return await self._store.transact(work)

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
