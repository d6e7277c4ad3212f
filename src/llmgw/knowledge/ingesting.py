"""Ingesting a document: its text, its passages, their vectors, stored all at once.

:meth:`Ingesting.prepare` reads and splits the document (a file of another
kind, or one that does not parse, is refused before anything is embedded);
:meth:`Ingesting.store` embeds the passages through the gateway in batches,
telling ``progress`` after each, and then writes the document with every
passage in one transaction: a crash before that leaves nothing, so a
document is visible only once all its passages are in.

Pairs for training come as JSON Lines of ``{"question": ..., "answer": ...}``
(:func:`parse_pairs`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from llmgw.core.filenames import escaped, filename_problem
from llmgw.errors import ValidationFailed
from llmgw.knowledge.embedding import BATCH, Embedder, Vectors, to_bytes
from llmgw.knowledge.extracting import extract
from llmgw.knowledge.splitting import Piece, Splitting, split
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.knowledge import CollectionRecord, DocumentRecord, KnowledgeStore, NewPassage

Progress = Callable[[int, int], None]
"""Told the passages embedded so far and how many there are."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A document read and split, not yet embedded."""

    name: str
    kind: str
    size: int
    sha256: str
    pieces: list[Piece]


def _no_progress(done: int, total: int) -> None:
    pass


class Ingesting:
    """Reads, splits, embeds and stores documents of collections."""

    def __init__(
        self,
        store: KnowledgeStore,
        embedder: Embedder,
        splitting: Splitting = Splitting(),
        clock: Clock = SYSTEM_CLOCK,
        batch: int = BATCH,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._splitting = splitting
        self._clock = clock
        self._batch = batch

    def prepare(self, name: str, data: bytes) -> Prepared:
        """The document read and split; ValidationFailed naming the file when it cannot be."""
        problem = filename_problem(name) or ("has spaces at its start or end" if name.strip() != name else "")
        if problem:
            raise ValidationFailed(
                [("name", f"document name {escaped(name[:80])!r} {problem}")],
                "upload the file under a plain file name",
            )
        kind, text = extract(name, data)
        pieces = split(text, self._splitting)
        if not pieces:
            raise ValidationFailed([("file", f"{name!r} holds no text")], "upload a document with text in it")
        return Prepared(name, kind, len(data), hashlib.sha256(data).hexdigest(), pieces)

    async def store(
        self, collection: CollectionRecord, prepared: Prepared, by: str, progress: Progress = _no_progress
    ) -> DocumentRecord:
        """Embed a prepared document's passages and store it whole (replacing one of the same name)."""
        texts = [piece.text for piece in prepared.pieces]
        vectors: list[Vectors] = []
        progress(0, len(texts))
        for at in range(0, len(texts), self._batch):
            batch = await self._embedder.embed(collection.embedding_model, texts[at : at + self._batch])
            vectors.extend(batch)
            progress(len(vectors), len(texts))
        passages = [
            NewPassage(piece.position, piece.text, piece.start, piece.end, to_bytes(vector))
            for piece, vector in zip(prepared.pieces, vectors, strict=True)
        ]
        document = DocumentRecord(
            prepared.name,
            prepared.kind,
            prepared.size,
            prepared.sha256,
            len(passages),
            by,
            datetime.fromtimestamp(self._clock.time(), UTC),
        )
        return await self._store.add_document(collection.name, document, passages)


def parse_pairs(data: bytes) -> list[tuple[str, str]]:
    """Question/answer pairs from JSON Lines; ValidationFailed naming the first bad line."""
    pairs = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            raise ValidationFailed(
                [(f"line {number}", f"is not JSON: {error}")],
                'write one {"question": ..., "answer": ...} a line',
            ) from None
        if not (
            isinstance(item, dict)
            and isinstance(item.get("question"), str)
            and isinstance(item.get("answer"), str)
        ):
            raise ValidationFailed(
                [(f"line {number}", "needs a string 'question' and a string 'answer'")],
                'write one {"question": ..., "answer": ...} a line',
            )
        pairs.append((item["question"], item["answer"]))
    if not pairs:
        raise ValidationFailed(
            [("file", "holds no pairs")], 'write one {"question": ..., "answer": ...} a line'
        )
    return pairs
