"""API keys: secrets shown once, kept only as hashes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from sqlalchemy import text

from llmgw.errors import Conflict, NotFound
from llmgw.store import Store, hash_secret
from llmgw.testing.clock import FakeClock


async def test_a_secret_is_sk_llmgw_and_40_url_safe_characters(store: Store) -> None:
    _, secret = await store.keys.create("ci")
    assert re.fullmatch(r"sk-llmgw-[A-Za-z0-9_-]{40}", secret)


async def test_a_key_has_a_short_random_id(store: Store) -> None:
    key, _ = await store.keys.create("ci")
    assert re.fullmatch(r"key_[0-9a-f]{8}", key.id)


async def test_a_key_keeps_the_first_eight_characters_for_display(store: Store) -> None:
    key, secret = await store.keys.create("ci", owner="alice")
    assert key.prefix == secret[len("sk-llmgw-") :][:8]
    assert key.owner == "alice"


async def test_the_database_row_holds_the_hash_and_never_the_secret(store: Store) -> None:
    _, secret = await store.keys.create("ci")
    async with store.engine.connect() as connection:
        rows = (await connection.execute(text("SELECT * FROM api_keys"))).all()
    assert len(rows) == 1
    assert rows[0]._mapping["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert all(secret not in str(value) for value in rows[0])


async def test_the_secret_appears_nowhere_in_the_database_files(store: Store, tmp_path: Path) -> None:
    if store.url.get_backend_name() != "sqlite":
        pytest.skip("reads SQLite's files")
    _, secret = await store.keys.create("ci")
    await store.close()
    stored = b"".join(path.read_bytes() for path in sorted(tmp_path.glob("store.db*")))  # noqa: ASYNC240
    assert hash_secret(secret).encode() in stored
    assert secret.encode() not in stored


async def test_hash_secret_is_the_sha256_of_the_whole_secret() -> None:
    assert hash_secret("sk-llmgw-abc") == hashlib.sha256(b"sk-llmgw-abc").hexdigest()


async def test_active_keys_carry_the_hash_of_their_secret(store: Store) -> None:
    _, secret = await store.keys.create("ci")
    [active] = await store.keys.active()
    assert active.secret_hash == hash_secret(secret)


async def test_a_revoked_key_leaves_the_active_ones_and_the_default_list(
    store: Store, clock: FakeClock
) -> None:
    kept, _ = await store.keys.create("kept")
    gone, _ = await store.keys.create("gone")
    revoked = await store.keys.revoke(gone.id)
    assert revoked.revoked_at == clock.utcnow()
    assert [key.id for key in await store.keys.active()] == [kept.id]
    assert [key.id for key in await store.keys.list()] == [kept.id]
    assert {key.id for key in await store.keys.list(include_revoked=True)} == {kept.id, gone.id}


async def test_a_key_keeps_its_default_collections_in_order_once_each(store: Store) -> None:
    await store.keys.create("kb", collections=["runbook", "handbook", "runbook"])
    await store.keys.create("plain")
    searched = {k.name: k.collections for k in await store.keys.active()}
    assert searched == {"kb": ("runbook", "handbook"), "plain": ()}


async def test_a_key_can_be_revoked_by_name(store: Store) -> None:
    await store.keys.create("ci")
    revoked = await store.keys.revoke("ci")
    assert not revoked.active
    assert await store.keys.active() == []


async def test_revoking_an_unknown_key_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="'nope'"):
        await store.keys.revoke("nope")


async def test_two_active_keys_cannot_share_a_name(store: Store) -> None:
    await store.keys.create("ci")
    with pytest.raises(Conflict, match="'ci'"):
        await store.keys.create("ci")


async def test_the_name_of_a_revoked_key_can_be_used_again(store: Store) -> None:
    await store.keys.create("ci")
    await store.keys.revoke("ci")
    again, _ = await store.keys.create("ci")
    assert [key.id for key in await store.keys.active()] == [again.id]
