"""Blob copies: which control planes hold each blob of the mirror, where they are reached, since when.

Every control plane keeps its mirror on its own disk; a row here says that
one of them holds a blob's whole, checked bytes. A plane records only its own
copies, and does so outside the leader's fence (like announcing itself in
``control_planes``): what a standby holds is a fact about that standby, not
desired state the leader decides, so a standby that pulled a blob says so
while another leads.

::

    copies = BlobCopies(store)
    await copies.record(sha256, "cp2", "10.0.0.2:8443")
    holders = await copies.of(sha256)          # every plane holding it, oldest copy first
    everything = await copies.all()            # by sha256
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, select

from llmgw.store.blobs import checked_sha256
from llmgw.store.tables import BlobCopyRow
from llmgw.store.upserting import dialect_insert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


@dataclass(frozen=True, slots=True)
class BlobCopy:
    """One control plane's copy of one blob."""

    sha256: str
    plane: str
    """The control plane's name."""
    address: str
    """host:port of its agent server: where peers and nodes fetch the blob from it."""
    copied_at: datetime


class BlobCopies:
    """Record a plane's copy (idempotent, unfenced), list the copies of one blob or of all."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def record(self, sha256: str, plane: str, address: str) -> None:
        """Say that ``plane`` (reached at ``address``) holds the blob; recording it again keeps the
        first time and refreshes the address."""
        sha256 = checked_sha256(sha256)
        values = {"sha256": sha256, "plane": plane, "address": address, "copied_at": self._store.now()}
        insert = dialect_insert(self._store.url.get_backend_name(), BlobCopyRow).values(values)
        statement = insert.on_conflict_do_update(
            index_elements=["sha256", "plane"], set_={"address": insert.excluded.address}
        )
        async with self._store.bounded(), self._store.engine.begin() as connection:
            await connection.execute(statement)

    async def forget(self, sha256: str, plane: str) -> None:
        """Say that ``plane`` no longer holds the blob (its file went missing or was damaged)."""
        sha256 = checked_sha256(sha256)
        statement = delete(BlobCopyRow).where(BlobCopyRow.sha256 == sha256, BlobCopyRow.plane == plane)
        async with self._store.bounded(), self._store.engine.begin() as connection:
            await connection.execute(statement)

    async def of(self, sha256: str) -> builtins.list[BlobCopy]:
        """The planes holding the blob, oldest copy first (none: an empty list)."""
        sha256 = checked_sha256(sha256)
        query = (
            select(BlobCopyRow)
            .where(BlobCopyRow.sha256 == sha256)
            .order_by(BlobCopyRow.copied_at, BlobCopyRow.plane)
        )
        async with self._store.session() as session:
            return [_copy(row) for row in await session.scalars(query)]

    async def all(self) -> dict[str, builtins.list[BlobCopy]]:
        """Every blob's copies, by sha256, oldest copy first."""
        query = select(BlobCopyRow).order_by(BlobCopyRow.copied_at, BlobCopyRow.plane)
        found: dict[str, builtins.list[BlobCopy]] = defaultdict(list)
        async with self._store.session() as session:
            for row in await session.scalars(query):
                found[row.sha256].append(_copy(row))
        return dict(found)


def _copy(row: BlobCopyRow) -> BlobCopy:
    return BlobCopy(sha256=row.sha256, plane=row.plane, address=row.address, copied_at=row.copied_at)
