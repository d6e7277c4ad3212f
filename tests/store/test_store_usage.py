"""Usage: batches appended in one go, summed per key and model, each row with its key's place."""

from __future__ import annotations

from datetime import timedelta

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.store import Store
from llmgw.store.database import MIGRATIONS
from llmgw.store.usage import UsageEntry, UsageLog, UsageTotal
from llmgw.testing.clock import FakeClock


def entry(clock: FakeClock, key: str, model: str, requests: int, prompt: int, completion: int) -> UsageEntry:
    return UsageEntry(clock.utcnow(), key, model, requests, 1, prompt, completion, 12)


async def test_batches_are_summed_per_key_and_model(store: Store, clock: FakeClock) -> None:
    log = UsageLog(store)
    await log.append([entry(clock, "k1", "chat", 2, 10, 3), entry(clock, "k1", "embed", 1, 7, 0)])
    await log.append([entry(clock, "k1", "chat", 3, 5, 2), entry(clock, "k2", "chat", 1, 1, 1)])
    assert await log.totals() == [
        UsageTotal("k1", "chat", 5, 2, 15, 5),
        UsageTotal("k1", "embed", 1, 1, 7, 0),
        UsageTotal("k2", "chat", 1, 1, 1, 1),
    ]


async def test_totals_since_leave_out_older_batches(store: Store, clock: FakeClock) -> None:
    log = UsageLog(store)
    await log.append([entry(clock, "k1", "chat", 1, 10, 3)])
    await clock.advance(3600)
    await log.append([entry(clock, "k1", "chat", 1, 4, 4)])
    since = clock.utcnow() - timedelta(minutes=1)
    assert await log.totals(since=since) == [UsageTotal("k1", "chat", 1, 1, 4, 4)]


async def test_an_empty_batch_writes_nothing(store: Store) -> None:
    log = UsageLog(store)
    await log.append([])
    assert await log.totals() == []


async def test_an_entry_is_stored_with_its_place_team_and_org(store: Store, clock: FakeClock) -> None:
    await UsageLog(store).append(
        [
            UsageEntry(clock.utcnow(), "k1", "chat", 1, 0, 1, 1, 1, place="project:acme/ml/chat"),
            UsageEntry(clock.utcnow(), "k2", "chat", 1, 0, 1, 1, 1, place="user:alice"),
            UsageEntry(clock.utcnow(), "k3", "chat", 1, 0, 1, 1, 1, place="not an owner"),
        ]
    )
    async with store.engine.connect() as connection:
        rows = (
            await connection.execute(text("SELECT key_id, place, team, org FROM usage ORDER BY key_id"))
        ).all()
    assert [tuple(r) for r in rows] == [
        ("k1", "project:acme/ml/chat", "team:acme/ml", "org:acme"),
        ("k2", "user:alice", "", ""),
        ("k3", "", "", ""),
    ]


async def test_the_migration_places_older_rows_where_their_key_sits(store_url: str) -> None:
    def to_0004(connection: Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("path_separator", "os")
        config.attributes["connection"] = connection
        command.upgrade(config, "0004")

    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(to_0004)
            for key_id, kind, path in (("k1", "project", "acme/ml/chat"), ("k2", "cluster", "")):
                await connection.execute(
                    text(
                        "INSERT INTO api_keys (id, name, prefix, secret_hash, owner, created_at, place_kind, "
                        "place_path) VALUES (:id, :id, 'p', :id, '', CURRENT_TIMESTAMP, :kind, :path)"
                    ),
                    {"id": key_id, "kind": kind, "path": path},
                )
                await connection.execute(
                    text(
                        "INSERT INTO usage (at, key_id, model, requests, failed, prompt_tokens, "
                        "completion_tokens, duration_ms) "
                        "VALUES (CURRENT_TIMESTAMP, :id, 'chat', 1, 0, 1, 1, 1)"
                    ),
                    {"id": key_id},
                )
    finally:
        await engine.dispose()
    store = await Store.open(store_url)
    try:
        async with store.engine.connect() as connection:
            rows = (
                await connection.execute(
                    text("SELECT key_id, place, team, org, streamed FROM usage ORDER BY key_id")
                )
            ).all()
    finally:
        await store.close()
    assert [tuple(r) for r in rows] == [
        ("k1", "project:acme/ml/chat", "team:acme/ml", "org:acme", 0),
        ("k2", "", "", "", 0),
    ]


async def test_a_refusal_written_with_a_sum_of_its_key_and_model_is_stored_beside_it_once(
    store: Store, clock: FakeClock
) -> None:
    log = UsageLog(store)
    served = entry(clock, "k1", "chat", 2, 10, 3)
    refused = UsageEntry(clock.utcnow(), "k1", "chat", 1, 1, 0, 0, 1, refused=429)
    assert await log.append_missing([served]) == 1
    assert await log.append_missing([served, refused]) == 1  # stamped alike, told apart by the refusal
    assert await log.append_missing([served, refused]) == 0
    assert await log.totals() == [UsageTotal("k1", "chat", 3, 2, 10, 3)]
