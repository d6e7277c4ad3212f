"""Knowledge collections as stored: collections, their documents, passages with vectors, and pairs.

A document is written with every one of its passages in one transaction
(:meth:`KnowledgeStore.add_document`), so a crash in the middle of an upload
leaves nothing of it: a document is visible only once all its passages are
in. Every change to a collection's documents bumps its ``revision``, which
tells the control planes' in-memory indexes to rebuild.

On SQLite the passages' text is also kept in an FTS5 table (``knowledge_fts``,
rowid = passage id) that :meth:`KnowledgeStore.keyword` searches with BM25;
on PostgreSQL :attr:`KnowledgeStore.full_text` is false and keyword search
is done in memory by the caller.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from llmgw.core.tenancy import Owner, OwnerKind
from llmgw.errors import Conflict, NotFound
from llmgw.store.keys import SECRET_PREFIX, SHOWN_PREFIX_CHARS, hash_secret
from llmgw.store.tables import (
    ApiKeyRow,
    KnowledgeCollectionRow,
    KnowledgeDocumentRow,
    KnowledgePairRow,
    KnowledgePassageRow,
)

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

LIST_HINT = "'llmgw ctl kb list' lists the collections you see"


@dataclass(frozen=True, slots=True)
class CollectionRecord:
    id: int
    name: str
    owner: Owner
    embedding_model: str
    created_by: str
    created_at: datetime
    revision: int
    documents: int = 0
    passages: int = 0


@dataclass(frozen=True, slots=True)
class DocumentRecord:
    name: str
    kind: str
    size: int
    sha256: str
    passages: int
    uploaded_by: str
    uploaded_at: datetime


@dataclass(frozen=True, slots=True)
class NewPassage:
    """A passage to store: its place in the document, text, character offsets and vector."""

    position: int
    text: str
    start: int
    end: int
    vector: bytes
    """float32 values, little-endian."""


@dataclass(frozen=True, slots=True)
class StoredPassage:
    id: int
    document: str
    position: int
    text: str
    vector: bytes


class KnowledgeStore:
    """Collections by name; documents, passages and pairs within them."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    @property
    def full_text(self) -> bool:
        """Whether the store searches keywords itself (SQLite's FTS5)."""
        return self._store.url.get_backend_name() == "sqlite"

    async def create(self, name: str, owner: Owner, embedding_model: str, by: str) -> CollectionRecord:
        """A new, empty collection; :class:`Conflict` when one of that name exists."""
        row = KnowledgeCollectionRow(
            name=name,
            owner_kind=owner.kind.value,
            owner_path=owner.path,
            embedding_model=embedding_model,
            created_by=by,
            created_at=self._store.now(),
            revision=0,
        )
        async with self._store.session() as session:
            if await _find(session, name) is not None:
                raise _exists(name)
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                raise _exists(name) from None
            return _collection(row)

    async def get(self, name: str) -> CollectionRecord:
        """The collection called ``name`` with its counts; :class:`NotFound` when there is none."""
        for record in await self.list([name]):
            return record
        raise missing(name)

    async def list(
        self, names: Sequence[str] | None = None, counted: bool = True
    ) -> builtins.list[CollectionRecord]:
        """Every collection (or those of ``names`` that exist), by name, with their counts (zero
        unless ``counted``)."""

        async def work(session: AsyncSession) -> builtins.list[CollectionRecord]:
            query = select(KnowledgeCollectionRow).order_by(KnowledgeCollectionRow.name)
            if names is not None:
                query = query.where(KnowledgeCollectionRow.name.in_(list(names)))
            rows = (await session.execute(query)).scalars().all()
            counts = {c: (d, p) for c, d, p in await _counts(session)} if counted else {}
            return [_collection(row, *counts.get(row.id, (0, 0))) for row in rows]

        return await self._store.read(work)

    async def delete(self, name: str) -> None:
        """Remove a collection with its documents, passages and pairs; :class:`NotFound` when none."""
        async with self._store.session() as session:
            row = await _find(session, name)
            if row is None:
                raise missing(name)
            if self.full_text:
                await session.execute(
                    text("DELETE FROM knowledge_fts WHERE collection_id = :id"), {"id": row.id}
                )
            for table in (KnowledgePassageRow, KnowledgeDocumentRow, KnowledgePairRow):
                await session.execute(delete(table).where(table.collection_id == row.id))
            await session.delete(row)

    async def add_document(
        self, collection: str, document: DocumentRecord, passages: Sequence[NewPassage]
    ) -> DocumentRecord:
        """Store a document with all its passages at once, replacing one of the same name."""
        async with self._store.session() as session:
            row = await _find(session, collection)
            if row is None:
                raise missing(collection)
            await self._remove_document(session, row.id, document.name)
            doc = KnowledgeDocumentRow(
                collection_id=row.id,
                name=document.name,
                kind=document.kind,
                size=document.size,
                sha256=document.sha256,
                passages=len(passages),
                uploaded_by=document.uploaded_by,
                uploaded_at=document.uploaded_at,
            )
            session.add(doc)
            await session.flush()
            rows = [
                KnowledgePassageRow(
                    collection_id=row.id,
                    document_id=doc.id,
                    position=p.position,
                    text=p.text,
                    start=p.start,
                    end=p.end,
                    vector=p.vector,
                )
                for p in passages
            ]
            session.add_all(rows)
            await session.flush()
            if self.full_text and rows:
                await session.execute(
                    text("INSERT INTO knowledge_fts (rowid, text, collection_id) VALUES (:id, :text, :c)"),
                    [{"id": r.id, "text": r.text, "c": row.id} for r in rows],
                )
            row.revision += 1
            return _document(doc)

    async def remove_document(self, collection: str, name: str) -> None:
        """Remove one document and its passages; :class:`NotFound` when it is not there."""
        async with self._store.session() as session:
            row = await _find(session, collection)
            if row is None:
                raise missing(collection)
            if not await self._remove_document(session, row.id, name):
                raise NotFound(
                    f"collection {collection!r} holds no document {name!r}",
                    f"'llmgw ctl kb list {collection}' lists its documents",
                )
            row.revision += 1

    async def _remove_document(self, session: AsyncSession, collection_id: int, name: str) -> bool:
        doc = (
            await session.execute(
                select(KnowledgeDocumentRow).where(
                    KnowledgeDocumentRow.collection_id == collection_id, KnowledgeDocumentRow.name == name
                )
            )
        ).scalar_one_or_none()
        if doc is None:
            return False
        if self.full_text:
            await session.execute(
                text(
                    "DELETE FROM knowledge_fts WHERE rowid IN "
                    "(SELECT id FROM knowledge_passages WHERE document_id = :d)"
                ),
                {"d": doc.id},
            )
        await session.execute(delete(KnowledgePassageRow).where(KnowledgePassageRow.document_id == doc.id))
        await session.delete(doc)
        await session.flush()
        return True

    async def documents(self, collection: str) -> builtins.list[DocumentRecord]:
        """The documents of a collection, by name."""

        async def work(session: AsyncSession) -> builtins.list[DocumentRecord]:
            row = await _find(session, collection)
            if row is None:
                raise missing(collection)
            query = (
                select(KnowledgeDocumentRow)
                .where(KnowledgeDocumentRow.collection_id == row.id)
                .order_by(KnowledgeDocumentRow.name)
            )
            return [_document(d) for d in (await session.execute(query)).scalars()]

        return await self._store.read(work)

    async def passages(self, collection_id: int) -> builtins.list[StoredPassage]:
        """Every passage of a collection with its vector (what an in-memory index is built from)."""

        async def work(session: AsyncSession) -> builtins.list[StoredPassage]:
            query = (
                select(
                    KnowledgePassageRow.id,
                    KnowledgeDocumentRow.name,
                    KnowledgePassageRow.position,
                    KnowledgePassageRow.text,
                    KnowledgePassageRow.vector,
                )
                .join(KnowledgeDocumentRow, KnowledgeDocumentRow.id == KnowledgePassageRow.document_id)
                .where(KnowledgePassageRow.collection_id == collection_id)
                .order_by(KnowledgePassageRow.id)
            )
            return [StoredPassage(*row) for row in (await session.execute(query)).all()]

        return await self._store.read(work)

    async def keyword(self, collection_id: int, query: str, limit: int) -> builtins.list[tuple[int, float]]:
        """Passage ids matching ``query``'s words (any of them), best first, with FTS5's BM25 score
        (higher is better). SQLite only (:attr:`full_text`)."""
        words = fts_words(query)
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in words)

        async def work(session: AsyncSession) -> builtins.list[tuple[int, float]]:
            rows = await session.execute(
                text(
                    "SELECT rowid, bm25(knowledge_fts) FROM knowledge_fts WHERE knowledge_fts MATCH :m "
                    "AND collection_id = :c ORDER BY bm25(knowledge_fts) LIMIT :k"
                ),
                {"m": match, "c": collection_id, "k": limit},
            )
            return [(int(pid), -float(score)) for pid, score in rows.all()]

        return await self._store.read(work)

    async def set_pairs(self, collection: str, pairs: Sequence[tuple[str, str]]) -> int:
        """Add question/answer pairs to a collection; how many it holds now."""
        async with self._store.session() as session:
            row = await _find(session, collection)
            if row is None:
                raise missing(collection)
            session.add_all(KnowledgePairRow(collection_id=row.id, question=q, answer=a) for q, a in pairs)
            await session.flush()
            count = await session.execute(
                select(func.count()).where(KnowledgePairRow.collection_id == row.id)
            )
            return int(count.scalar_one())

    async def pairs(self, collection: str) -> tuple[CollectionRecord, builtins.list[tuple[str, str]]]:
        """A collection and its question/answer pairs, in the order added."""

        async def work(session: AsyncSession) -> tuple[CollectionRecord, builtins.list[tuple[str, str]]]:
            row = await _find(session, collection)
            if row is None:
                raise missing(collection)
            query = (
                select(KnowledgePairRow.question, KnowledgePairRow.answer)
                .where(KnowledgePairRow.collection_id == row.id)
                .order_by(KnowledgePairRow.id)
            )
            return _collection(row), [(q, a) for q, a in (await session.execute(query)).all()]

        return await self._store.read(work)

    async def ensure_service_key(self, name: str, secret: str) -> bool:
        """Keep an active API key of ``secret`` (at the cluster: public models only) under ``name``;
        whether it had to be written (a new or revived key the gateway must reload)."""
        digest = hash_secret(secret)
        async with self._store.session() as session:
            row = (
                await session.execute(select(ApiKeyRow).where(ApiKeyRow.secret_hash == digest))
            ).scalar_one_or_none()
            if row is not None and row.revoked_at is None:
                return False
            if row is not None:
                row.revoked_at = None
                return True
            session.add(
                ApiKeyRow(
                    id=digest[:32],
                    name=name,
                    prefix=secret.removeprefix(SECRET_PREFIX)[:SHOWN_PREFIX_CHARS],
                    secret_hash=digest,
                    owner="llmgw",
                    created_at=self._store.now(),
                    place_kind=OwnerKind.CLUSTER.value,
                    place_path="",
                )
            )
            return True


def fts_words(query: str) -> list[str]:
    """The words of a query as FTS5 terms (letters and digits only, so no query syntax gets through)."""
    return re.findall(r"\w+", query.lower())[:64]


async def _counts(session: AsyncSession) -> list[tuple[int, int, int]]:
    rows = await session.execute(
        select(
            KnowledgeDocumentRow.collection_id,
            func.count(),
            func.coalesce(func.sum(KnowledgeDocumentRow.passages), 0),
        ).group_by(KnowledgeDocumentRow.collection_id)
    )
    return [(int(c), int(d), int(p)) for c, d, p in rows.all()]


async def _find(session: AsyncSession, name: str) -> KnowledgeCollectionRow | None:
    query = select(KnowledgeCollectionRow).where(KnowledgeCollectionRow.name == name)
    return (await session.execute(query)).scalar_one_or_none()


def _collection(row: Any, documents: int = 0, passages: int = 0) -> CollectionRecord:
    owner = Owner(OwnerKind(row.owner_kind), row.owner_path)
    return CollectionRecord(
        row.id, row.name, owner, row.embedding_model, row.created_by, row.created_at, row.revision,
        documents, passages,
    )  # fmt: skip


def _document(row: KnowledgeDocumentRow) -> DocumentRecord:
    return DocumentRecord(
        row.name, row.kind, row.size, row.sha256, row.passages, row.uploaded_by, row.uploaded_at
    )


def missing(name: str) -> NotFound:
    return NotFound(f"collection {name!r} does not exist", LIST_HINT)


def _exists(name: str) -> Conflict:
    return Conflict(f"a collection named {name!r} exists already", "pick another name, or delete it first")
