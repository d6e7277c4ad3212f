"""Question/answer pairs of a collection, for training jobs.

The pairs keep the collection as their owner: a training job made from them
is owned where the collection is, and pairs from a knowledge base are never
made public (SPEC C8.3). The training side asks through a Protocol of this
shape (``training/pairs.py``).
"""

from __future__ import annotations

from llmgw.core.tenancy import Owner
from llmgw.errors import NotFound
from llmgw.store.knowledge import KnowledgeStore


class CollectionPairs:
    """Reads a collection's pairs with its owner."""

    def __init__(self, store: KnowledgeStore) -> None:
        self._store = store

    async def pairs(self, collection: str) -> tuple[Owner, list[tuple[str, str]]]:
        """The collection's owner and its pairs, in the order added; NotFound when there is no such
        collection (what ``training/pairs.py`` expects)."""
        try:
            record, pairs = await self._store.pairs(collection)
        except NotFound:
            raise NotFound(
                f"no knowledge collection {collection!r}", "`llmgw ctl kb list` lists the collections you see"
            ) from None
        return record.owner, pairs
