"""Knowledge collections as the data path sees them: passages found for a request, and who may search.

A collection is owned like a model (:class:`~llmgw.core.tenancy.Owner`): a
key sees it when :func:`~llmgw.core.tenancy.visible` says so, and to anyone
else it does not exist. The gateway asks a :class:`KnowledgeSearch` for the
passages of the collections a request names; the control plane implements
it (``llmgw.knowledge``) over the index it keeps. :func:`cache_salt` is the
engines' prefix-cache salt for a request that searched: it follows the
collections searched, so two teams never share cached passages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from llmgw.core.tenancy import Place

SERVING_AN_EMBEDDING_MODEL = (
    "llmgw up (make up) serves no embedding model; serve one, e.g. all-MiniLM-L6-v2: "
    "'make embedding-model' prints its GGUF, then 'llmgw model serve GGUF --name minilm "
    "--serves embeddings --pooling mean --ctx-size 512 --parallel 1', and name it with "
    "--embedding-model minilm or 'llmgw ctl config set knowledge.embedding_model minilm' "
    "(docs/knowledge.md)"
)
"""How to get an embedding model for collections, where a cluster has none."""


@dataclass(frozen=True, slots=True)
class Passage:
    """One passage found: where it comes from, its text, and how well it matched (higher is better)."""

    collection: str
    document: str
    """The document's name as uploaded (its source)."""
    position: int
    """The passage's index within its document, from 0."""
    text: str
    score: float


class UnknownCollection(LookupError):
    """A collection that does not exist, or that the caller may not read (the same to the caller)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"collection {name!r} does not exist")
        self.name = name


class KnowledgeSearch(Protocol):
    """Searches collections for a query on behalf of a caller sitting at ``place``."""

    async def search(
        self, place: Place, collections: Sequence[str], query: str, limit: int
    ) -> Sequence[Passage]:
        """The best ``limit`` passages across ``collections``, best first.

        Raises :class:`UnknownCollection` for the first name that does not
        exist or that ``place`` may not read.
        """
        ...


def cache_salt(collections: Iterable[str]) -> str:
    """The prefix-cache salt of a request that searched ``collections`` (order and repeats do not matter)."""
    names = sorted(set(collections))
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return f"kb-{digest[:32]}"
