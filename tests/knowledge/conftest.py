"""A store per test (SQLite, and PostgreSQL where a server can be started, as tests/store does)
and the hashed stand-in embedder."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.knowledge.service import Knowledge, knowledge_with
from llmgw.store import Store
from llmgw.testing import postgres
from llmgw.testing.clock import FakeClock
from llmgw.testing.components import skip_missing
from llmgw.testing.hashed_embeddings import HashedEmbedder

POSTGRES_URL = os.environ.get("LLMGW_TEST_POSTGRES_URL", "")
LEFT_OUT = os.environ.get("LLMGW_TEST_POSTGRES", "1") == "0"
BACKENDS = ["sqlite", "postgresql"]
"""Both always: where PostgreSQL cannot run, its half is a reported skip, not left uncollected."""


def _postgres_or_skip() -> None:
    if LEFT_OUT:
        pytest.skip("LLMGW_TEST_POSTGRES=0 leaves PostgreSQL out")
    if not POSTGRES_URL and not postgres.available():
        skip_missing("PostgreSQL's server binaries (initdb, pg_ctl)", "run 'make postgres'")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    _postgres_or_skip()
    if POSTGRES_URL:
        yield POSTGRES_URL
        return
    with postgres.postgres() as server:
        yield server.url


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store opened (and so migrated) on an empty database."""
    if request.param == "postgresql":
        _postgres_or_skip()
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
