"""Settings: JSON values by key, every change recorded."""

from __future__ import annotations

import pytest

from llmgw.errors import NotFound
from llmgw.store import Store
from llmgw.testing.clock import FakeClock


async def test_an_unset_key_reads_as_the_default(store: Store) -> None:
    assert await store.settings.get("router.policy", "least-load") == "least-load"


async def test_a_set_value_reads_back(store: Store) -> None:
    await store.settings.set("router.weights", {"load": 1.0, "prefix": 0.5}, actor="alice")
    assert await store.settings.get("router.weights") == {"load": 1.0, "prefix": 0.5}
    assert await store.settings.all() == {"router.weights": {"load": 1.0, "prefix": 0.5}}


async def test_every_change_is_recorded_with_its_actor_newest_first(store: Store, clock: FakeClock) -> None:
    await store.settings.set("limit", 1, actor="alice")
    await clock.advance(1)
    await store.settings.set("limit", 2, actor="bob")
    history = await store.settings.history("limit")
    assert [(change.value, change.actor) for change in history] == [(2, "bob"), (1, "alice")]
    assert history[0].changed_at == clock.utcnow()
    assert await store.settings.get("limit") == 2


async def test_a_deletion_is_recorded_and_the_key_reads_as_unset(store: Store) -> None:
    await store.settings.set("limit", 1, actor="alice")
    await store.settings.delete("limit", actor="bob")
    assert await store.settings.get("limit") is None
    latest = (await store.settings.history("limit"))[0]
    assert (latest.deleted, latest.value, latest.actor) == (True, None, "bob")


async def test_setting_json_null_is_not_a_deletion(store: Store) -> None:
    await store.settings.set("limit", None, actor="alice")
    assert await store.settings.all() == {"limit": None}
    assert not (await store.settings.history("limit"))[0].deleted


async def test_deleting_an_unset_key_raises_not_found_and_records_nothing(store: Store) -> None:
    with pytest.raises(NotFound, match="'limit'"):
        await store.settings.delete("limit", actor="alice")
    assert await store.settings.history() == []


async def test_history_can_be_narrowed_to_a_key_and_limited(store: Store) -> None:
    for value in range(5):
        await store.settings.set("a", value, actor="alice")
    await store.settings.set("b", "x", actor="alice")
    assert [change.value for change in await store.settings.history("a", limit=2)] == [4, 3]
    assert len(await store.settings.history()) == 6
