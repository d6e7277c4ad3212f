"""The knowledge parts one control plane holds, and how they are made.

:func:`knowledge_for` is the one constructor the control plane's wiring
calls (and the gateway's wiring takes :attr:`Knowledge.index` from, as its
:class:`~llmgw.core.knowledge.KnowledgeSearch`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmgw.core import settingtypes
from llmgw.knowledge.embedding import SERVICE_KEY_NAME, Embedder, GatewayEmbedder, service_secret
from llmgw.knowledge.ingesting import Ingesting
from llmgw.knowledge.pairs import CollectionPairs
from llmgw.knowledge.searching import KnowledgeIndex
from llmgw.store.database import Store

EMBEDDING_MODEL_SETTING = settingtypes.EMBEDDING_MODEL_SETTING
"""The cluster setting naming the embedding model a new collection uses when none is named."""


@dataclass
class Knowledge:
    store: Store
    embedder: Embedder
    index: KnowledgeIndex
    ingesting: Ingesting
    pairs: CollectionPairs
    service_secret: str = ""
    """The secret of the key the embedder uses ("" when the embedder needs none)."""

    async def ensure_key(self, on_keys_changed: Callable[[], Awaitable[None]]) -> None:
        """Write the control planes' own key if it is missing or revoked (the leader does, before
        embedding), then have the gateway reload its keys."""
        if self.service_secret and await self.store.knowledge.ensure_service_key(
            SERVICE_KEY_NAME, self.service_secret
        ):
            await on_keys_changed()

    async def close(self) -> None:
        """Close the embedder's connections (when it holds any)."""
        if isinstance(self.embedder, GatewayEmbedder):
            await self.embedder.close()

    async def default_model(self) -> str:
        value = await self.store.settings.get(EMBEDDING_MODEL_SETTING, "")
        return value if isinstance(value, str) else ""


def knowledge_with(store: Store, embedder: Embedder, secret: str = "") -> Knowledge:
    """Knowledge over ``store`` with an embedder of one's own (tests, benchmarks)."""
    return Knowledge(
        store,
        embedder,
        KnowledgeIndex(store.knowledge, embedder),
        Ingesting(store.knowledge, embedder, clock=store.clock),
        CollectionPairs(store.knowledge),
        secret,
    )


def knowledge_for(store: Store, admin_token_sha256: str, base_url: Callable[[], str]) -> Knowledge:
    """A control plane's knowledge: embedding through its own ``/v1`` at ``base_url()`` with the key
    derived from the admin token."""
    secret = service_secret(admin_token_sha256)
    return knowledge_with(store, GatewayEmbedder(base_url, secret), secret)


def own_url(host: str, port: int) -> str:
    """Where a control plane reaches its own HTTP port: an address it listens on (loopback for
    every address)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
