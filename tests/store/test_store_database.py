"""Opening the store: migrations, SQLite's settings, and errors translated at the boundary."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from llmgw.errors import ConfigError, StoreError, StoreUnavailable
from llmgw.store import Store
from llmgw.store.tables import Base
from llmgw.testing.eventually import eventually


async def worker_threads_finished() -> None:
    """Wait for aiosqlite's thread of a failed connection, which reports its stop to the loop."""
    await eventually(
        lambda: not any("_connection_worker_thread" in thread.name for thread in threading.enumerate()),
        timeout_s=5,
        message="aiosqlite's worker thread ends",
    )


TABLES = {
    "models",
    "replicas",
    "nodes",
    "api_keys",
    "settings",
    "settings_history",
    "audit",
    "blobs",
    "blob_copies",
    "knowledge_collections",
    "knowledge_documents",
    "knowledge_passages",
    "knowledge_pairs",
    "kept_responses",
    "store_secrets",
}


async def test_opening_creates_every_table(store: Store) -> None:
    async with store.engine.connect() as connection:
        names = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    assert names >= TABLES | {"alembic_version"}


async def test_opening_migrates_to_the_newest_revision(store: Store) -> None:
    async with store.engine.connect() as connection:
        version = (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
    assert version == "0022"


async def test_the_migrations_create_exactly_the_declared_tables(store: Store) -> None:
    def differences(connection: Connection) -> list[object]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return [
            diff
            for diff in compare_metadata(context, Base.metadata)
            if not (
                diff[0] == "remove_table" and diff[1].name.startswith(("alembic_version", "knowledge_fts"))
            )
        ]

    async with store.engine.connect() as connection:
        assert await connection.run_sync(differences) == []


async def test_opening_an_existing_store_keeps_its_records(store_url: str) -> None:
    first = await Store.open(store_url)
    await first.models.add("kept", {"a": 1})
    await first.close()
    second = await Store.open(store_url)
    try:
        assert (await second.models.get("kept")).definition == {"a": 1}
    finally:
        await second.close()


async def test_stores_opened_together_in_one_process_all_migrate(store_url: str) -> None:
    stores = await asyncio.gather(*(Store.open(store_url) for _ in range(4)))
    try:
        await asyncio.gather(*(store.settings.set("k", index, "test") for index, store in enumerate(stores)))
        assert len(await stores[0].settings.history("k")) == 4
    finally:
        for store in stores:
            await store.close()


OPEN_AND_WRITE = """
import asyncio, sys
from llmgw.store import Store

async def main():
    store = await Store.open(sys.argv[1], timeout_s=30)
    await store.audit.record("process", "open", sys.argv[2])
    await store.close()

asyncio.run(main())
"""


async def test_processes_opening_one_new_sqlite_file_together_all_migrate(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", OPEN_AND_WRITE, url, str(index), stderr=asyncio.subprocess.PIPE
        )
        for index in range(4)
    ]
    errors = [(await process.communicate())[1].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0, 0], errors
    async with await Store.open(url) as store:
        assert sorted(entry.target for entry in await store.audit.list()) == ["0", "1", "2", "3"]


async def test_sqlite_uses_wal_foreign_keys_and_a_busy_wait_shorter_than_the_timeout(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 's.db'}", timeout_s=3.0)
    try:
        async with store.engine.connect() as connection:
            mode = (await connection.execute(text("PRAGMA journal_mode"))).scalar_one()
            keys = (await connection.execute(text("PRAGMA foreign_keys"))).scalar_one()
            busy = (await connection.execute(text("PRAGMA busy_timeout"))).scalar_one()
    finally:
        await store.close()
    assert (mode, keys) == ("wal", 1)
    assert 0 < busy < 3000


async def test_a_plain_sqlite_url_gets_the_async_driver(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}")
    try:
        assert store.url.drivername == "sqlite+aiosqlite"
    finally:
        await store.close()


async def test_ping_succeeds_on_an_open_store(store: Store) -> None:
    await store.ping()


async def test_a_closed_store_refuses_calls(store_url: str) -> None:
    store = await Store.open(store_url)
    await store.close()
    with pytest.raises(StoreError, match="is closed"):
        await store.models.list()


async def test_a_file_in_a_missing_folder_raises_store_unavailable(tmp_path: Path) -> None:
    folder = tmp_path / "missing"
    with pytest.raises(StoreUnavailable) as caught:
        await Store.open(f"sqlite+aiosqlite:///{folder / 'store.db'}", timeout_s=2.0)
    assert str(folder) in caught.value.hint
    await worker_threads_finished()


async def test_a_file_in_an_unreadable_folder_raises_store_unavailable(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        if os.access(folder, os.W_OK | os.X_OK):
            pytest.skip("this user reads and writes any folder (root)")
        with pytest.raises(StoreUnavailable):
            await Store.open(f"sqlite+aiosqlite:///{folder / 'store.db'}", timeout_s=2.0)
        await worker_threads_finished()
    finally:
        folder.chmod(0o700)


async def test_a_closed_postgres_port_raises_store_unavailable_without_the_password() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await Store.open("postgresql+asyncpg://u:secretpw@127.0.0.1:9/x", timeout_s=2.0)
    assert time.monotonic() - started < 2.5
    assert "127.0.0.1:9" in str(caught.value)
    assert "secretpw" not in str(caught.value)
    assert caught.value.hint == "check that the database is running and reachable"


async def test_a_server_that_never_answers_raises_store_unavailable_within_the_timeout() -> None:
    held: list[asyncio.StreamWriter] = []

    async def accept_and_stay_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept_and_stay_silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match=r"did not answer within 0\.5 s"):
            await Store.open(f"postgresql+asyncpg://u:p@127.0.0.1:{port}/x", timeout_s=0.5)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert time.monotonic() - started < 1.5


async def test_a_call_blocked_by_a_lock_raises_store_unavailable_within_the_timeout(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 's.db'}"
    holder = await Store.open(url)
    store = await Store.open(url, timeout_s=0.5)
    try:
        async with holder.engine.connect() as locked:
            await locked.execute(text("BEGIN EXCLUSIVE"))
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="locked"):
                await store.models.add("m", {})
            assert time.monotonic() - started < 1.5
            await locked.rollback()
    finally:
        await store.close()
        await holder.close()


async def test_an_unsupported_database_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="does not support 'mysql'"):
        await Store.open("mysql://u:p@localhost/x")


async def test_an_unreadable_url_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        await Store.open("not a url")
