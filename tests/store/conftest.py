"""Fixtures for the store's tests: a fresh database per test, and a clock the test moves.

Every test runs against SQLite in its own folder. Set ``LLMGW_TEST_POSTGRES_URL``
(``postgresql+asyncpg://user:pass@host:port/db``, a database these tests may
wipe) to run each of them against PostgreSQL too.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from store_fakes import FakeClock

from llmgw.store import Store

POSTGRES_URL = os.environ.get("LLMGW_TEST_POSTGRES_URL", "")
BACKENDS = ["sqlite", "postgresql"] if POSTGRES_URL else ["sqlite"]


async def _wipe_postgres(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("DROP SCHEMA public CASCADE"))
            await connection.execute(text("CREATE SCHEMA public"))
    finally:
        await engine.dispose()


@pytest.fixture(params=BACKENDS)
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database."""
    if request.param == "postgresql":
        await _wipe_postgres(POSTGRES_URL)
        return POSTGRES_URL
    return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    """A store opened (and so migrated) on an empty database."""
    store = await Store.open(store_url, timeout_s=5.0, clock=clock)
    try:
        yield store
    finally:
        await store.close()
