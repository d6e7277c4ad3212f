"""Engine keys sealed at rest: stored sealed, read back plain, old plain rows sealed, the key checked."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from llmgw.errors import ConfigError, StoreError
from llmgw.store import ReplicaRecord, Store
from llmgw.store.secretbox import PREFIX, SecretBox, load_or_create


def replica(replica_id: str, key: str) -> ReplicaRecord:
    return ReplicaRecord(id=replica_id, model="m", node_id="node-1", api_key=key, devices=(), memory_mb=1)


async def stored_keys(store: Store) -> dict[str, str]:
    async with store.engine.connect() as connection:
        rows = await connection.execute(text("SELECT id, api_key FROM replicas"))
        return {row.id: row.api_key for row in rows}


@pytest.fixture
def box() -> SecretBox:
    return SecretBox(SecretBox.new_key())


async def test_engine_keys_are_stored_sealed_and_read_back_plain(store_url: str, box: SecretBox) -> None:
    async with await Store.open(store_url, secrets=box) as store:
        await store.models.add("m", {})
        await store.replicas.add(replica("r1", "llmgw-replica-one"))
        await store.replicas.add_all([replica("r2", "llmgw-replica-two")])
        raw = await stored_keys(store)
        assert all(value.startswith(PREFIX) and "llmgw-replica" not in value for value in raw.values())
        assert len(raw["r1"]) <= 128  # the column's width on PostgreSQL
        assert (await store.replicas.get("r1")).api_key == "llmgw-replica-one"
        assert {r.id: r.api_key for r in await store.replicas.list()} == {
            "r1": "llmgw-replica-one",
            "r2": "llmgw-replica-two",
        }


async def test_rows_stored_plain_read_as_they_are_and_are_sealed_once_a_key_opens_the_store(
    store_url: str, box: SecretBox
) -> None:
    async with await Store.open(store_url) as store:  # as before keys were sealed
        await store.models.add("m", {})
        await store.replicas.add(replica("r1", "llmgw-replica-old"))
        assert await stored_keys(store) == {"r1": "llmgw-replica-old"}
    async with await Store.open(store_url, secrets=box) as store:
        assert (await stored_keys(store))["r1"].startswith(PREFIX)
        assert (await store.replicas.get("r1")).api_key == "llmgw-replica-old"
    async with await Store.open(store_url) as store:  # a tool without the key says what it lacks
        with pytest.raises(StoreError, match="opened without the store key"):
            await store.replicas.list()


async def test_a_store_opened_with_another_key_is_refused_before_anything_is_sealed(
    store_url: str, box: SecretBox
) -> None:
    async with await Store.open(store_url, secrets=box) as store:
        await store.models.add("m", {})
        await store.replicas.add(replica("r1", "llmgw-replica-one"))
    with pytest.raises(ConfigError, match=r"store-secrets\.key is not the key") as refused:
        await Store.open(store_url, secrets=SecretBox(SecretBox.new_key()))
    assert "copy it from another control plane" in refused.value.hint
    async with await Store.open(store_url, secrets=box) as store:
        assert (await store.replicas.get("r1")).api_key == "llmgw-replica-one"


async def test_a_sealed_key_moved_to_another_row_does_not_open(store_url: str, box: SecretBox) -> None:
    async with await Store.open(store_url, secrets=box) as store:
        await store.models.add("m", {})
        await store.replicas.add(replica("r1", "llmgw-replica-one"))
        await store.replicas.add(replica("r2", "llmgw-replica-two"))
        raw = await stored_keys(store)
        async with store.engine.begin() as connection:
            await connection.execute(
                text("UPDATE replicas SET api_key = :k WHERE id = 'r2'"), {"k": raw["r1"]}
            )
        with pytest.raises(StoreError, match="cannot be opened"):
            await store.replicas.get("r2")


def test_the_key_file_is_made_owner_only_once_and_read_back(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        made = load_or_create(tmp_path / "store-secrets.key")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "store-secrets.key").stat().st_mode) == 0o600
    sealed = made.seal("secret", "row")
    assert load_or_create(tmp_path / "store-secrets.key").open(sealed, "row") == "secret"


def test_a_damaged_key_file_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "store-secrets.key").write_text("not a key\n")
    with pytest.raises(ConfigError, match="holds no store key") as refused:
        load_or_create(tmp_path / "store-secrets.key")
    assert "copy it from another control plane" in refused.value.hint


def sqlite_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith("llmgw.db")]


async def test_the_sqlite_file_and_its_wal_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
        try:
            await store.models.add("m", {})
            files = sqlite_files(tmp_path)
            assert {p.name for p in files} >= {"llmgw.db"}
            assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o600 for p in files}
        finally:
            await store.close()
        (tmp_path / "llmgw.db").chmod(0o644)  # a store made before: its mode is narrowed on open
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}"):
            assert stat.S_IMODE((tmp_path / "llmgw.db").stat().st_mode) == 0o600
    finally:
        os.umask(previous)


async def test_a_second_store_on_the_same_file_leaves_the_first_ones_locks(tmp_path: Path) -> None:
    """Closing a descriptor of the file would drop this process's POSIX locks, SQLite's included: another
    process closing its connection would then take the file for its own and remove the WAL in use."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}"
    reader = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM models')"
    async with await Store.open(url) as first:
        await first.models.add("m1", {})
        async with await Store.open(url):
            await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", reader, str(tmp_path / "llmgw.db")], check=True
            )
            await first.models.add("m2", {})
            async with await Store.open(url) as fresh:
                assert {m.name for m in await fresh.models.list()} == {"m1", "m2"}
