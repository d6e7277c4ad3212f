"""A stand-in embedder for unit tests: words hashed into a fixed number of dimensions.

Texts that share words get vectors with a positive cosine, which is enough to
test ranking, fusion and storage without a model. End-to-end tests and the
benchmark use the real all-MiniLM-L6-v2 served by llama-server instead
(:mod:`llmgw.testing.embedding_model`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from llmgw.knowledge.embedding import Vectors


class HashedEmbedder:
    """Embeds each word into one of ``dimensions`` buckets; counts every call and text."""

    def __init__(self, dimensions: int = 64) -> None:
        self.dimensions = dimensions
        self.calls: list[tuple[str, int]] = []
        """(model, number of texts) of every call."""
        self.fail_after: int | None = None
        """Raise after this many calls (to stand in for a model that goes away mid-upload)."""

    async def embed(self, model: str, texts: Sequence[str]) -> Vectors:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("the stand-in embedder was told to fail")
        self.calls.append((model, len(texts)))
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                bucket = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
                out[row, bucket % self.dimensions] += 1.0
        return out
