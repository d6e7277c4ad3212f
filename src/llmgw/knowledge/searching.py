"""Searching collections: vector, keyword, or both fused (the gateway's :class:`KnowledgeSearch`).

:class:`KnowledgeIndex` answers :meth:`~KnowledgeIndex.search` for the
gateway (a key's :class:`~llmgw.core.tenancy.Place`) and
:meth:`~KnowledgeIndex.search_in` for ``/api`` (collections the caller was
already allowed to read). Per search it reads the collections' rows (their
revisions: one small read), ranks the passages by keywords (BM25 in memory;
FTS5 in a SQLite store when built with ``keywords_in_store``) while the query
is embedded (once per embedding model, through the gateway), then ranks them
by cosine in the collections' in-memory indexes (:mod:`llmgw.knowledge.indexes`)
and, in ``hybrid`` mode, fuses the two rankings by reciprocal rank. The
rankings and the index builds run in worker threads, off the event loop the
gateway serves on. Every control plane, a standby too, can search: the index
is built from what the store holds.

The control plane that takes an upload or a document's removal starts the
collection's new index at once (:meth:`~KnowledgeIndex.build_soon`), in the
background, so the next search there finds it built (or under way) instead of
starting a build of seconds at 100k passages. Other control planes build it on
their first search at the new revision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from enum import StrEnum

from llmgw.core.knowledge import Passage, UnknownCollection
from llmgw.core.tenancy import Owner, Place, visible
from llmgw.knowledge.embedding import Embedder, Vectors
from llmgw.knowledge.indexes import CollectionIndex, fuse, query_terms
from llmgw.store.knowledge import CollectionRecord, KnowledgeStore

log = logging.getLogger(__name__)

CANDIDATES = 50
"""Passages each ranking contributes per collection before fusion."""


class Mode(StrEnum):
    HYBRID = "hybrid"
    VECTOR = "vector"
    KEYWORD = "keyword"


class KnowledgeIndex:
    """Searches collections; keeps one in-memory index per collection searched."""

    def __init__(
        self,
        store: KnowledgeStore,
        embedder: Embedder,
        candidates: int = CANDIDATES,
        keywords_in_store: bool = False,
    ) -> None:
        """``keywords_in_store``: rank keywords with the store's FTS5 (SQLite) instead of in memory
        (the benchmark compares the two: bench/knowledge)."""
        self._store = store
        self._embedder = embedder
        self._candidates = candidates
        self._in_store = keywords_in_store and store.full_text
        self._indexes: dict[int, CollectionIndex] = {}
        self._builds: dict[int, tuple[int, asyncio.Future[CollectionIndex]]] = {}
        """Index builds under way: collection id -> (revision, build)."""
        self._soon: dict[int, asyncio.Task[None]] = {}
        """Builds asked for after a change, not yet started: collection id -> the task that will."""

    async def search(
        self, place: Place, collections: Sequence[str], query: str, limit: int
    ) -> Sequence[Passage]:
        """The best ``limit`` passages of ``collections`` for ``query`` (hybrid), as a key at ``place``
        sees them; :class:`UnknownCollection` for the first name it cannot read."""
        records = await self.readable(collections, lambda owner: visible(owner, place))
        return await self.search_in(records, query, limit)

    async def readable(self, names: Sequence[str], sees: Callable[[Owner], bool]) -> list[CollectionRecord]:
        """The collections of ``names``, in order; UnknownCollection for one missing or not seen."""
        found = {r.name: r for r in await self._store.list(list(dict.fromkeys(names)), counted=False)}
        records = []
        for name in dict.fromkeys(names):
            record = found.get(name)
            if record is None or not sees(record.owner):
                raise UnknownCollection(name)
            records.append(record)
        return records

    async def search_in(
        self, records: Sequence[CollectionRecord], query: str, limit: int, mode: Mode = Mode.HYBRID
    ) -> list[Passage]:
        """Search collections already found readable."""
        if limit <= 0 or not records or not query.strip():
            return []
        indexes = [await self.index(record) for record in records]
        pairs = list(zip(records, indexes, strict=True))
        keyword_hits = asyncio.ensure_future(self._keyword_hits(pairs, query, mode))
        try:  # keywords are ranked while the query is embedded and its nearest passages found
            nearest = await self._vector_hits(pairs, query, mode)
            hits = await keyword_hits
        finally:
            if not keyword_hits.done():
                keyword_hits.cancel()
        by_vector = [(score, (number, row)) for number, found in enumerate(nearest) for row, score in found]
        by_keyword = [(score, (number, row)) for number, found in enumerate(hits) for row, score in found]
        rankings = {
            Mode.VECTOR: [_ranked(by_vector)],
            Mode.KEYWORD: [_ranked(by_keyword)],
            Mode.HYBRID: [_ranked(by_vector), _ranked(by_keyword)],
        }[mode]
        scored = (
            fuse(rankings)
            if mode is Mode.HYBRID
            else [
                (key, score)
                for score, key in sorted(
                    by_vector if mode is Mode.VECTOR else by_keyword, key=lambda e: -e[0]
                )
            ]
        )
        out = []
        for (number, row), score in scored[:limit]:
            passage = indexes[number].passages[row]
            out.append(Passage(records[number].name, passage.document, passage.position, passage.text, score))
        return out

    async def _vector_hits(
        self, pairs: Sequence[tuple[CollectionRecord, CollectionIndex]], query: str, mode: Mode
    ) -> list[list[tuple[int, float]]]:
        if mode is Mode.KEYWORD:
            return [[] for _ in pairs]
        models = [
            model
            for model in dict.fromkeys(r.embedding_model for r, _ in pairs)
            if any(i.passages for r, i in pairs if r.embedding_model == model)
        ]
        embedded = await asyncio.gather(*(self._embedder.embed(m, [query]) for m in models))
        vectors = {model: found[0] for model, found in zip(models, embedded, strict=True)}
        return await asyncio.to_thread(self._nearest, pairs, vectors)

    async def _keyword_hits(
        self, pairs: Sequence[tuple[CollectionRecord, CollectionIndex]], query: str, mode: Mode
    ) -> list[list[tuple[int, float]]]:
        if mode is Mode.VECTOR:
            return [[] for _ in pairs]
        return list(await asyncio.gather(*(self._keywords(r, i, query) for r, i in pairs)))

    def _nearest(
        self, pairs: Sequence[tuple[CollectionRecord, CollectionIndex]], vectors: dict[str, Vectors]
    ) -> list[list[tuple[int, float]]]:
        return [
            index.nearest(vectors[record.embedding_model], self._candidates)
            if record.embedding_model in vectors
            else []
            for record, index in pairs
        ]

    async def _keywords(
        self, record: CollectionRecord, index: CollectionIndex, query: str
    ) -> list[tuple[int, float]]:
        terms = " ".join(query_terms(query))
        if not terms:
            return []
        if index.keywords is not None:
            return await asyncio.to_thread(index.keywords.search, terms, self._candidates)
        found = await self._store.keyword(record.id, terms, self._candidates)
        return [(index.row_of[pid], score) for pid, score in found if pid in index.row_of]

    async def index(self, record: CollectionRecord) -> CollectionIndex:
        """The collection's in-memory index at the record's revision (built, or built again, here).

        One build per collection and revision, whoever asks; a search that gives up waiting (the
        gateway's timeout) leaves the build running, so a later search finds it done."""
        current = self._indexes.get(record.id)
        if current is not None and current.revision == record.revision:
            return current
        building = self._builds.get(record.id)
        if building is None or building[0] != record.revision:
            task = asyncio.ensure_future(self._build(record))
            task.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved
            building = self._builds[record.id] = (record.revision, task)
        return await asyncio.shield(building[1])

    async def _build(self, record: CollectionRecord) -> CollectionIndex:
        try:
            passages = await self._store.passages(record.id)
            built = await asyncio.to_thread(  # seconds at 100k passages: off the event loop
                CollectionIndex, record.revision, passages, not self._in_store
            )
            current = self._indexes.get(record.id)
            if current is None or current.revision <= built.revision:
                self._indexes[record.id] = built
            return built
        finally:
            if self._builds.get(record.id, (0, None))[1] is asyncio.current_task():
                del self._builds[record.id]

    def forget(self, collection_id: int) -> None:
        """Drop a collection's index (it was deleted)."""
        self._indexes.pop(collection_id, None)
        if soon := self._soon.pop(collection_id, None):
            soon.cancel()

    def held(self, collection_id: int) -> int | None:
        """The revision of the collection's index held in memory; None when none is."""
        current = self._indexes.get(collection_id)
        return None if current is None else current.revision

    def build_soon(self, record: CollectionRecord) -> None:
        """Start building the collection's index at its latest revision, in the background (its
        documents just changed). A build under way is let finish first; asked again meanwhile, the
        one build that follows reads the revision then, so a run of uploads builds at most twice."""
        if record.id in self._soon:
            return
        task = asyncio.ensure_future(self._build_latest(record))
        self._soon[record.id] = task
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved

    async def _build_latest(self, record: CollectionRecord) -> None:
        try:
            if building := self._builds.get(record.id):
                await asyncio.wait({building[1]})
        finally:
            if self._soon.get(record.id) is asyncio.current_task():
                del self._soon[record.id]  # a change from here on asks for a build of its own
        try:
            latest = await self._store.list([record.name], counted=False)
            if latest and latest[0].id == record.id and self.held(record.id) != latest[0].revision:
                await self.index(latest[0])
        except Exception:  # a search builds it then
            log.warning(
                "building the index of collection %s after its change failed; its next search builds it",
                record.name,
                exc_info=True,
            )


def _ranked(entries: list[tuple[float, tuple[int, int]]]) -> list[tuple[int, int]]:
    return [key for _, key in sorted(entries, key=lambda e: -e[0])]
