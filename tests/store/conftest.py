"""Fixtures for the store's tests: a fresh database per test, and a clock the test moves.

Every test runs against SQLite in its own folder and against PostgreSQL: a
throwaway cluster this session starts (``llmgw.testing.postgres``), or the
database named by ``LLMGW_TEST_POSTGRES_URL`` (``postgresql+asyncpg://user:pass@host:port/db``,
one these tests may wipe). ``LLMGW_TEST_POSTGRES=0`` leaves PostgreSQL out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.store import Store
from llmgw.testing import postgres
from llmgw.testing.clock import FakeClock

BACKENDS = postgres.BACKENDS


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL database for the whole session: the given one, or a throwaway cluster."""
    with postgres.session_database() as url:
        yield url


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
        postgres.skip_unless_usable()
        url: str = request.getfixturevalue("postgres_url")
        await _wipe_postgres(url)
        return url
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
