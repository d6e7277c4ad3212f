"""The store through a PostgreSQL failover: no primary yet, a connection left on a server that no
longer takes writes, a connection lost under a read (C1.1). The Patroni failover itself is
tests/e2e/test_store_failover.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from llmgw.errors import StoreError, StoreUnavailable
from llmgw.store import Store

# without PostgreSQL, the postgres_url fixture skips these (a failure under CI=true)


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(postgres_url)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_url_none_of_whose_servers_takes_writes_raises_store_unavailable(postgres_url: str) -> None:
    with pytest.raises(StoreUnavailable, match="takes writes now") as caught:
        await Store.open(f"{postgres_url}?target_session_attrs=read-only", timeout_s=2.0)
    assert "target_session_attrs=read-write" in caught.value.hint


async def test_a_connection_on_a_server_that_no_longer_takes_writes_is_dropped_with_the_pool(
    store: Store,
) -> None:
    async with store.session() as session:  # as if the server under the pooled connection was demoted
        await session.execute(text("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"))
    with pytest.raises(StoreUnavailable, match="cannot take this statement now"):
        await store.models.put("demoted", {"source": {"sha256": "0" * 64}})
    await store.models.put("demoted", {"source": {"sha256": "0" * 64}})  # a fresh connection
    assert (await store.models.get("demoted")).name == "demoted"
    await store.models.remove("demoted")


async def test_a_read_whose_connection_is_lost_under_it_runs_again_on_a_fresh_one(store: Store) -> None:
    calls: list[int] = []

    async def read(session: AsyncSession) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the server ends this very connection, as a failover does
            await session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return (await session.execute(text("SELECT 41 + 1"))).scalar_one()

    assert await store.read(read) == 42
    assert len(calls) == 2


async def test_a_read_that_fails_for_another_reason_is_not_run_again(store: Store) -> None:
    calls: list[int] = []

    async def read(session: AsyncSession) -> Any:
        calls.append(1)
        return (await session.execute(text("SELECT 1 / 0"))).scalar_one()

    with pytest.raises(StoreError, match="division by zero") as caught:
        await store.read(read)
    assert not isinstance(caught.value, StoreUnavailable)
    assert len(calls) == 1
