"""The in-memory index of one collection: its vectors (cosine, exact) and, where the store has no
full-text search, BM25 over its passages; and reciprocal rank fusion of two rankings.

Every control plane (leader and standbys) keeps one :class:`CollectionIndex`
per collection searched, built from the vectors and texts in the store and
built again when the collection's revision changes. The vector search is
exact: one matrix product over the collection's normalised vectors
(100k passages of 384 dimensions: about 150 MB, a few milliseconds).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from llmgw.knowledge.embedding import Vectors, from_bytes, normalized
from llmgw.store.knowledge import StoredPassage

RRF_K = 60
"""Reciprocal rank fusion's constant (Cormack et al. 2009): a passage scores Σ 1 / (k + rank)."""

K = TypeVar("K", bound=Hashable)

_TOKEN = re.compile(r"\w+")


STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers him his how i if in into is it its itself just me more most my no nor not now of
    off on once only or other our ours out over own same she should so some such than that the their them
    then there these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours""".split()
)
"""English words too common to rank by: a keyword query leaves them out (a passage matching only
"the" or "of" would otherwise rank above one the vectors found, once fused)."""


def stem(word: str) -> str:
    """A light English stemmer (plural and verb endings), close to what FTS5's porter tokenizer
    does for the common cases: ``taxes`` and ``tax``, ``searched`` and ``search`` meet."""
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("es", ""), ("ing", ""), ("ed", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: -len(suffix)] + keep
    return word


def tokens(text: str) -> list[str]:
    return [stem(t) for t in _TOKEN.findall(text.lower())]


def query_terms(query: str) -> list[str]:
    """The words of a query that keyword search ranks by: no stopwords, each once."""
    words = _TOKEN.findall(query.lower())
    return list(dict.fromkeys(w for w in words if w not in STOPWORDS))


@dataclass
class Bm25:
    """Okapi BM25 (k1 = 1.2, b = 0.75) over passages held in memory."""

    k1: float = 1.2
    b: float = 0.75
    postings: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    lengths: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, texts: Sequence[str]) -> Bm25:
        index = cls()
        for row, text in enumerate(texts):
            counts = Counter(tokens(text))
            index.lengths.append(sum(counts.values()))
            for term, count in counts.items():
                index.postings[term].append((row, count))
        return index

    def search(self, query: str, limit: int) -> list[tuple[int, float]]:
        """(row, score) of the best ``limit`` rows, best first."""
        count = len(self.lengths)
        if not count:
            return []
        average = sum(self.lengths) / count or 1.0
        scores: dict[int, float] = defaultdict(float)
        for term in dict.fromkeys(tokens(" ".join(query_terms(query)))):
            posting = self.postings.get(term)
            if not posting:
                continue
            idf = math.log(1 + (count - len(posting) + 0.5) / (len(posting) + 0.5))
            for row, tf in posting:
                norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[row] / average)
                scores[row] += idf * tf * (self.k1 + 1) / norm
        return sorted(scores.items(), key=lambda item: -item[1])[:limit]


class CollectionIndex:
    """One collection's passages at one revision, searchable by vector and (in memory) by keywords."""

    def __init__(self, revision: int, passages: Sequence[StoredPassage], with_keywords: bool) -> None:
        self.revision = revision
        self.passages = list(passages)
        self.row_of = {p.id: row for row, p in enumerate(self.passages)}
        if self.passages:
            self.vectors: Vectors = normalized(np.stack([from_bytes(p.vector) for p in self.passages]))
        else:
            self.vectors = np.zeros((0, 0), dtype=np.float32)
        self.keywords = Bm25.of([p.text for p in self.passages]) if with_keywords else None

    @property
    def dimensions(self) -> int | None:
        return int(self.vectors.shape[1]) if self.passages else None

    def nearest(self, query: Vectors, limit: int) -> list[tuple[int, float]]:
        """(row, cosine) of the ``limit`` rows nearest ``query``, best first."""
        if not self.passages or query.shape[-1] != self.vectors.shape[1]:
            return []
        scores = self.vectors @ normalized(query.reshape(1, -1))[0]
        limit = min(limit, len(scores))
        top = np.argpartition(-scores, limit - 1)[:limit]
        top = top[np.argsort(-scores[top])]
        return [(int(row), float(scores[row])) for row in top]


def fuse(rankings: Sequence[Sequence[K]], k: int = RRF_K) -> list[tuple[K, float]]:
    """Reciprocal rank fusion of rankings (best first): (item, fused score), best first; ties keep
    the order items first appeared in."""
    scores: dict[K, float] = defaultdict(float)
    for ranking in rankings:
        for rank, item in enumerate(ranking):
            scores[item] += 1.0 / (k + rank + 1)
    return sorted(scores.items(), key=lambda entry: -entry[1])
