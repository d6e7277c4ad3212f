"""A store per test (SQLite, and PostgreSQL where a server can be started, as tests/store does)
and the hashed stand-in embedder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.knowledge.service import Knowledge, knowledge_with
from llmgw.store import Store
from llmgw.testing import postgres
from llmgw.testing.clock import FakeClock
from llmgw.testing.hashed_embeddings import HashedEmbedder

BACKENDS = postgres.BACKENDS


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with postgres.session_database() as url:
        yield url


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store opened (and so migrated) on an empty database."""
    if request.param == "postgresql":
        postgres.skip_unless_usable()
        url: str = request.getfixturevalue("postgres_url")
        engine = create_async_engine(url)
        async with engine.begin() as connection:
            await connection.execute(text("DROP SCHEMA public CASCADE"))
            await connection.execute(text("CREATE SCHEMA public"))
        await engine.dispose()
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    store = await Store.open(url, timeout_s=5.0, clock=FakeClock())
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def embedder() -> HashedEmbedder:
    return HashedEmbedder()


@pytest.fixture
def knowledge(store: Store, embedder: HashedEmbedder) -> Knowledge:
    return knowledge_with(store, embedder)
