"""Blobs: the files the mirror keeps (model weights, engine builds), known by their sha256.

The bytes live in the mirror's folder; the store only records which files it
has, how big they are and what they are for.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select

from llmgw.errors import NotFound, ValidationFailed
from llmgw.store.tables import BlobRow, rowcount
from llmgw.store.upserting import upsert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

KINDS = ("weights", "build", "file")
"""What a blob can be: a model's weights, an engine build, or a client's file (``/v1/files``)."""

SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class BlobRecord:
    """A file the mirror holds."""

    sha256: str
    size: int
    """Bytes."""
    filename: str
    """The name it was imported under."""
    kind: str
    """``weights``, ``build`` or ``file``."""
    created_at: datetime
    owner: str = ""
    """The user who uploaded it (empty: the cluster's)."""


class Blobs:
    """Mirror files by sha256: add (idempotent), read, list, remove."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def add(self, sha256: str, size: int, filename: str, kind: str, owner: str = "") -> BlobRecord:
        """Record a file; adding one already recorded returns the record kept (its first owner's)."""
        sha256 = checked_sha256(sha256)
        problems = []
        if kind not in KINDS:
            problems.append(("kind", f"must be one of {', '.join(KINDS)}"))
        if size < 0:
            problems.append(("size", "must not be negative"))
        if problems:
            raise ValidationFailed(problems)
        async with self._store.session() as session:
            values = {"sha256": sha256, "size": size, "filename": filename, "kind": kind, "owner": owner}
            row = await upsert(session, BlobRow, {**values, "created_at": self._store.now()}, key="sha256")
            return _record(row)

    async def get(self, sha256: str) -> BlobRecord:
        """The file with that sha256; :class:`NotFound` when the mirror does not have it."""
        sha256 = checked_sha256(sha256)
        async with self._store.session() as session:
            row = await session.get(BlobRow, sha256)
            if row is None:
                raise _missing(sha256)
            return _record(row)

    async def remove(self, sha256: str) -> None:
        """Forget the file; :class:`NotFound` when it is not recorded."""
        sha256 = checked_sha256(sha256)
        async with self._store.session() as session:
            result = await session.execute(delete(BlobRow).where(BlobRow.sha256 == sha256))
            if not rowcount(result):
                raise _missing(sha256)

    async def bytes_of(self, owner: str) -> int:
        """The bytes of the blobs ``owner`` uploaded (a client's files are counted apart: ``files``)."""
        query = select(func.coalesce(func.sum(BlobRow.size), 0)).where(
            BlobRow.owner == owner, BlobRow.kind != "file"
        )
        async with self._store.session() as session:
            return int(await session.scalar(query) or 0)

    async def list(self) -> builtins.list[BlobRecord]:
        """Every file, oldest first."""
        query = select(BlobRow).order_by(BlobRow.created_at, BlobRow.sha256)
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]


def checked_sha256(sha256: str) -> str:
    """``sha256`` as 64 lower-case hex digits (``sha256:`` dropped); ValidationFailed otherwise."""
    value = sha256.removeprefix("sha256:").lower()
    if not SHA256.match(value):
        raise ValidationFailed([("sha256", "must be 64 hexadecimal digits (the file's sha256)")])
    return value


def _record(row: BlobRow) -> BlobRecord:
    return BlobRecord(
        sha256=row.sha256,
        size=row.size,
        filename=row.filename,
        kind=row.kind,
        created_at=row.created_at,
        owner=row.owner,
    )


def _missing(sha256: str) -> NotFound:
    return NotFound(
        f"the mirror has no file with sha256 {sha256}", hint="llmgw mirror import adds a file to the mirror"
    )
