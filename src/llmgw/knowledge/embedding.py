"""Embedding passages and queries through the cluster's own ``/v1``, like any client.

:class:`GatewayEmbedder` posts ``/v1/embeddings`` to the control plane's own
HTTP port, in batches, with the control plane's own API key
(:func:`service_secret`). That key is derived, not stored: an HMAC of the
admin token's sha256, which every control plane of a cluster holds, so every
one of them (a standby too) knows the same secret without it ever being
written anywhere; the store keeps only its sha256, as for any key, in a key
named :data:`SERVICE_KEY_NAME` at the cluster (so it sees public models
only: a collection's embedding model is a public one). The leader writes
that key the first time a collection is created or written to.

Vectors are float32 arrays, kept in the store as little-endian bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp
import numpy as np
import numpy.typing as npt

from llmgw.errors import LlmgwError, ValidationFailed

SERVICE_KEY_NAME = "llmgw-knowledge"
"""The API key the control planes embed with (``llmgw ctl key list`` shows it)."""

BATCH = 32
"""Passages per ``/v1/embeddings`` request."""

Vectors = npt.NDArray[np.float32]


class EmbeddingFailed(LlmgwError):
    """The embedding model could not embed (not served, not an embedding model, out of reach)."""

    status = 503


class Embedder(Protocol):
    """Turns texts into vectors with a named embedding model."""

    async def embed(self, model: str, texts: Sequence[str]) -> Vectors:
        """One row per text, in order."""
        ...


def service_secret(admin_token_sha256: str) -> str:
    """The control planes' own API key secret, derived from the admin token's sha256."""
    mac = hmac.new(bytes.fromhex(admin_token_sha256), b"llmgw knowledge embedding key", hashlib.sha256)
    return "sk-llmgw-" + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def to_bytes(vector: npt.NDArray[np.float32]) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> Vectors:
    return np.frombuffer(data, dtype="<f4")


def normalized(vectors: Vectors) -> Vectors:
    """Rows scaled to length 1 (a zero row stays zero), so a dot product is the cosine."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)


class GatewayEmbedder:
    """Embeds through ``{base_url()}/v1/embeddings`` with ``secret``, :data:`BATCH` texts a request."""

    def __init__(
        self, base_url: Callable[[], str], secret: str, timeout_s: float = 120.0, batch: int = BATCH
    ) -> None:
        self._base_url = base_url
        self._secret = secret
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._batch = batch
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def embed(self, model: str, texts: Sequence[str]) -> Vectors:
        rows: list[list[float]] = []
        for at in range(0, len(texts), self._batch):
            rows.extend(await self._request(model, list(texts[at : at + self._batch])))
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)

    async def _request(self, model: str, batch: list[str]) -> list[list[float]]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self._base_url().rstrip('/')}/v1/embeddings"
        headers = {"Authorization": f"Bearer {self._secret}"}
        try:
            async with self._session.post(
                url, json={"model": model, "input": batch}, headers=headers
            ) as answer:
                body = await answer.json(content_type=None)
                if answer.status != 200:
                    detail = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
                    raise EmbeddingFailed(
                        f"the embedding model {model!r} answered {answer.status}: {detail or body}",
                        "check that the model is public, serves embeddings ('serves: embeddings') and "
                        "has a ready replica ('llmgw ctl models')",
                    )
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
            raise EmbeddingFailed(
                f"cannot reach the gateway at {url} to embed: {error or type(error).__name__}",
                "check that this control plane serves /v1 (llmgw ctl status)",
            ) from error
        data = sorted(body.get("data", []), key=lambda item: item.get("index", 0))
        if len(data) != len(batch):
            raise EmbeddingFailed(
                f"the embedding model {model!r} gave {len(data)} vectors for {len(batch)} texts",
                "check that the model is an embedding model",
            )
        return [list(item["embedding"]) for item in data]


def check_dimensions(vectors: Vectors, expected: int | None, model: str) -> None:
    """ValidationFailed when vectors do not have the width a collection's others have."""
    if expected is not None and vectors.shape[1] != expected:
        raise ValidationFailed(
            [
                (
                    "embedding_model",
                    f"{model!r} gives {vectors.shape[1]} dimensions, the collection {expected}",
                )
            ],
            "create a new collection for another embedding model",
        )
