"""An admin API as a test builds it: a real app on a real store, with an empty fleet and a reconciler."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.knowledge.service import knowledge_with
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store
from llmgw.testing.hashed_embeddings import HashedEmbedder

TOKEN = "llmgw-admin-test-token"
"""The admin token of :func:`admin_api` unless another is given."""


async def _nothing() -> None:
    return None


def empty_fleet() -> Fleet:
    """A fleet with no node, whose replicas go nowhere."""
    return Fleet(on_ready=lambda replica, url: None, on_gone=lambda replica_id: None)


def admin_api(
    store: Store, folder: Path, *, token: str = TOKEN, fleet: Fleet | None = None, **options: Any
) -> AdminApi:
    """:class:`AdminApi` named cp1 on ``store``, its mirror in ``folder``; ``options`` go to it as they are
    (``on_keys_changed``, ``components``, ``settings_push``, ``callers``...). Its knowledge
    collections embed with :class:`~llmgw.testing.hashed_embeddings.HashedEmbedder`."""
    fleet = fleet or empty_fleet()
    options.setdefault("on_keys_changed", _nothing)
    api = AdminApi(
        name="cp1",
        token_sha256=hashlib.sha256(token.encode()).hexdigest(),
        store=store,
        fleet=fleet,
        reconciler=Reconciler(store, fleet),
        blobs=BlobStore(folder / "mirror"),
        **options,
    )
    api.state.knowledge = knowledge_with(store, HashedEmbedder())  # knowledge collections, no model needed
    return api


@asynccontextmanager
async def admin_app(
    folder: Path, *, front: Callable[[AdminApi], Any] | None = None, **options: Any
) -> AsyncIterator[Any]:
    """The admin app on a SQLite store in ``folder`` (closed after); ``front`` wraps it (the admission
    layer, as a control plane serves it); ``options`` go to :func:`admin_api`."""
    store = await Store.open(f"sqlite+aiosqlite:///{folder / 'llmgw.db'}")
    try:
        admin = admin_api(store, folder, **options)
        yield front(admin) if front is not None else admin.app()
    finally:
        await store.close()
