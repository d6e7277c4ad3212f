"""The in-memory index of one collection: its vectors (cosine, exact) and BM25 over its passages
(unless the store's FTS5 ranks them); and reciprocal rank fusion of two rankings.

Every control plane (leader and standbys) keeps one :class:`CollectionIndex`
per collection searched, built from the vectors and texts in the store and
built again when the collection's revision changes. The vector search is
exact: one matrix-vector product over the collection's normalised float32
vectors, kept as one contiguous matrix (100k passages of 384 dimensions:
about 150 MB, a few milliseconds), and a partial sort for the best.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
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


@functools.lru_cache(maxsize=1 << 17)  # a collection's words repeat: building 100k passages stems ~6M
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


class Bm25:
    """Okapi BM25 (k1 = 1.2, b = 0.75) over passages held in memory, scored with NumPy.

    Each term keeps the rows holding it and, per row, its BM25 term weight
    ``tf·(k1+1) / (tf + k1·(1 - b + b·length/average))``, computed once when
    built; a query adds ``idf * weight`` into one score per row and takes the
    best with a partial sort (100k passages: about a millisecond).
    """

    def __init__(self, rows: dict[str, np.ndarray], weights: dict[str, np.ndarray], count: int) -> None:
        self._rows = rows
        self._weights = weights
        self.count = count

    @classmethod
    def of(cls, texts: Sequence[str], k1: float = 1.2, b: float = 0.75) -> Bm25:
        postings: dict[str, list[int]] = defaultdict(list)
        frequencies: dict[str, list[int]] = defaultdict(list)
        lengths = np.zeros(len(texts), dtype=np.float32)
        for row, text in enumerate(texts):
            counts = Counter(tokens(text))
            lengths[row] = sum(counts.values())
            for term, count in counts.items():
                postings[term].append(row)
                frequencies[term].append(count)
        average = float(lengths.mean()) if len(texts) else 1.0
        norms = k1 * (1 - b + b * lengths / (average or 1.0))
        rows: dict[str, np.ndarray] = {}
        weights: dict[str, np.ndarray] = {}
        for term, held in postings.items():
            at = np.array(held, dtype=np.int32)
            tf = np.array(frequencies[term], dtype=np.float32)
            rows[term] = at
            weights[term] = tf * (k1 + 1) / (tf + norms[at])
        return cls(rows, weights, len(texts))

    def search(self, query: str, limit: int) -> list[tuple[int, float]]:
        """(row, score) of the best ``limit`` rows, best first."""
        if not self.count or limit <= 0:
            return []
        scores: np.ndarray | None = None
        for term in dict.fromkeys(tokens(" ".join(query_terms(query)))):
            rows = self._rows.get(term)
            if rows is None:
                continue
            idf = math.log(1 + (self.count - len(rows) + 0.5) / (len(rows) + 0.5))
            if scores is None:
                scores = np.zeros(self.count, dtype=np.float32)
            scores[rows] += np.float32(idf) * self._weights[term]  # a term's rows are distinct
        if scores is None:
            return []
        matched = np.flatnonzero(scores)
        if len(matched) > limit:
            matched = matched[np.argpartition(-scores[matched], limit - 1)[:limit]]
        best = matched[np.lexsort((matched, -scores[matched]))]  # ties: the earlier row first
        return [(int(row), float(scores[row])) for row in best]


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
        # einsum's own loop on this thread, not BLAS: the product is bound by memory (150 MB at 100k
        # passages), so BLAS's threads add nothing but wait on each other when a core is busy
        scores = np.einsum("ij,j->i", self.vectors, normalized(query.reshape(1, -1))[0])
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
