"""Client files: what ``/v1/files`` keeps (uploads, a batch's output and errors), owned by a place.

A file's bytes are a blob of the mirror (kind ``file``), replicated to the
other control planes as every blob is; a row here names the file, who owns
it, what it is for and when it expires. Two files with the same bytes share
one blob. When the last file naming a blob goes, :meth:`ClientFiles.release`
forgets the blob's record (only a ``file`` blob, and only while no file names
it, in one statement); each control plane's mirror replicator then removes
its copy (``controlplane/mirror/replicating.py``).

Written through the client store (no fence): any process that answers a
client writes them.
"""

from __future__ import annotations

import builtins
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, exists, func, select

from llmgw.store.clienttables import ClientFileRow
from llmgw.store.tables import BlobRow, rowcount

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


def new_file_id() -> str:
    """A file's id, as OpenAI's look (``file-`` and 24 letters and digits)."""
    return "file-" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A client's file as the store keeps it."""

    id: str
    owner: str
    key_id: str
    purpose: str
    filename: str
    size: int
    sha256: str
    created_at: datetime
    expires_at: datetime | None

    def as_openai(self) -> dict[str, Any]:
        """The file as OpenAI's API answers it (``openai.types.FileObject``)."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": int(self.created_at.timestamp()),
            "expires_at": None if self.expires_at is None else int(self.expires_at.timestamp()),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


class ClientFiles:
    """Client files by id: add, read, list, delete, expire; and blobs no file names any more."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def add(
        self,
        *,
        owner: str,
        key_id: str,
        purpose: str,
        filename: str,
        size: int,
        sha256: str,
        expires_s: float | None,
    ) -> FileRecord:
        """Record a file whose bytes are blob ``sha256``; it expires ``expires_s`` from now (None: never)."""
        now = self._store.now()
        row = ClientFileRow(
            id=new_file_id(),
            owner=owner,
            key_id=key_id,
            purpose=purpose,
            filename=filename,
            size=size,
            sha256=sha256,
            created_at=now,
            expires_at=None if expires_s is None else now + timedelta(seconds=expires_s),
        )
        async with self._store.session() as session:
            session.add(row)
        return _record(row)

    async def get(self, owner: str, file_id: str) -> FileRecord | None:
        """File ``file_id`` when ``owner`` has it and it has not expired; None otherwise."""

        async def read(session: Any) -> FileRecord | None:
            row = await session.get(ClientFileRow, file_id)
            if row is None or row.owner != owner or _expired(row, self._store.now()):
                return None
            return _record(row)

        return await self._store.read(read)

    async def list(
        self,
        owner: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10_000,
        newest_first: bool = True,
    ) -> tuple[builtins.list[FileRecord], bool] | None:
        """``owner``'s files (of ``purpose``), in order from the one after ``after``, and whether
        more follow; None when ``after`` names no file of ``owner``."""
        now = self._store.now()
        query = select(ClientFileRow).where(
            ClientFileRow.owner == owner,
            (ClientFileRow.expires_at.is_(None)) | (ClientFileRow.expires_at > now),
        )
        if purpose is not None:
            query = query.where(ClientFileRow.purpose == purpose)
        async with self._store.session() as session:
            if after is not None:
                start = await session.get(ClientFileRow, after)
                if start is None or start.owner != owner:
                    return None
                if newest_first:
                    query = query.where(
                        (ClientFileRow.created_at < start.created_at)
                        | ((ClientFileRow.created_at == start.created_at) & (ClientFileRow.id < start.id))
                    )
                else:
                    query = query.where(
                        (ClientFileRow.created_at > start.created_at)
                        | ((ClientFileRow.created_at == start.created_at) & (ClientFileRow.id > start.id))
                    )
            if newest_first:
                query = query.order_by(ClientFileRow.created_at.desc(), ClientFileRow.id.desc())
            else:
                query = query.order_by(ClientFileRow.created_at, ClientFileRow.id)
            rows = list(await session.scalars(query.limit(limit + 1)))
        return [_record(row) for row in rows[:limit]], len(rows) > limit

    async def bytes_of(self, owner: str) -> int:
        """The bytes of ``owner``'s files not expired."""
        now = self._store.now()
        query = select(func.coalesce(func.sum(ClientFileRow.size), 0)).where(
            ClientFileRow.owner == owner,
            (ClientFileRow.expires_at.is_(None)) | (ClientFileRow.expires_at > now),
        )
        async with self._store.session() as session:
            return int(await session.scalar(query) or 0)

    async def delete(self, owner: str, file_id: str) -> FileRecord | None:
        """Delete file ``file_id`` of ``owner``; the file deleted, or None when it has none such."""
        async with self._store.session() as session:
            row = await session.get(ClientFileRow, file_id)
            if row is None or row.owner != owner or _expired(row, self._store.now()):
                return None
            record = _record(row)
            await session.delete(row)
        return record

    async def expired(self, limit: int = 500) -> builtins.list[FileRecord]:
        """Delete up to ``limit`` files past their expiry; those deleted."""
        now = self._store.now()
        async with self._store.session() as session:
            rows = list(
                await session.scalars(
                    select(ClientFileRow)
                    .where(ClientFileRow.expires_at.is_not(None), ClientFileRow.expires_at <= now)
                    .order_by(ClientFileRow.expires_at)
                    .limit(limit)
                )
            )
            if rows:
                await session.execute(delete(ClientFileRow).where(ClientFileRow.id.in_([r.id for r in rows])))
        return [_record(row) for row in rows]

    async def naming(self, sha256: str, limit: int = 5) -> builtins.list[str]:
        """The ids of up to ``limit`` files whose bytes are blob ``sha256`` (expired ones too, until
        swept)."""
        query = select(ClientFileRow.id).where(ClientFileRow.sha256 == sha256).order_by(ClientFileRow.id)
        async with self._store.session() as session:
            return list(await session.scalars(query.limit(limit)))

    async def release(self, sha256: str) -> bool:
        """Forget blob ``sha256``'s record when it is a client file's and no file names it any more
        (one statement: a file recorded meanwhile keeps it); whether it was forgotten."""
        named = exists().where(ClientFileRow.sha256 == sha256)
        statement = delete(BlobRow).where(BlobRow.sha256 == sha256, BlobRow.kind == "file", ~named)
        async with self._store.session() as session:
            return bool(rowcount(await session.execute(statement)))


def _expired(row: ClientFileRow, now: datetime) -> bool:
    return row.expires_at is not None and row.expires_at <= now


def _record(row: ClientFileRow) -> FileRecord:
    return FileRecord(
        id=row.id,
        owner=row.owner,
        key_id=row.key_id,
        purpose=row.purpose,
        filename=row.filename,
        size=row.size,
        sha256=row.sha256,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )
