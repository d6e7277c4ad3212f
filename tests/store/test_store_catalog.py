"""The catalog: models by name."""

from __future__ import annotations

import dataclasses

import pytest

from llmgw.errors import Conflict, NotFound
from llmgw.store import Store
from llmgw.testing.clock import FakeClock

DEFINITION = {"source": {"sha256": "a" * 64, "filename": "m.gguf"}, "profiles": [{"engine": "llama.cpp"}]}


async def test_an_added_model_reads_back_with_its_definition(store: Store, clock: FakeClock) -> None:
    added = await store.models.add("smollm2", DEFINITION)
    read = await store.models.get("smollm2")
    assert read == added
    assert read.definition == DEFINITION
    assert read.created_at == read.updated_at == clock.utcnow()


async def test_adding_an_existing_name_raises_conflict(store: Store) -> None:
    await store.models.add("smollm2", DEFINITION)
    with pytest.raises(Conflict) as caught:
        await store.models.add("smollm2", {"other": True})
    assert caught.value.message == "model 'smollm2' already exists"
    assert caught.value.hint == "remove it first or choose another name"
    assert (await store.models.get("smollm2")).definition == DEFINITION


async def test_put_adds_a_model_that_does_not_exist(store: Store) -> None:
    await store.models.put("smollm2", DEFINITION)
    assert (await store.models.get("smollm2")).definition == DEFINITION


async def test_put_replaces_the_definition_and_keeps_created_at(store: Store, clock: FakeClock) -> None:
    first = await store.models.add("smollm2", DEFINITION)
    await clock.advance(60)
    later = clock.utcnow()
    replaced = await store.models.put("smollm2", {"replaced": True})
    assert replaced.definition == {"replaced": True}
    assert replaced.created_at == first.created_at
    assert replaced.updated_at == later


async def test_getting_an_unknown_model_raises_not_found_with_a_hint(store: Store) -> None:
    with pytest.raises(NotFound) as caught:
        await store.models.get("nope")
    assert "'nope'" in caught.value.message
    assert caught.value.hint == "llmgw ctl models lists the catalog"


async def test_list_returns_every_model_by_name(store: Store) -> None:
    for name in ("b", "c", "a"):
        await store.models.add(name, {"name": name})
    assert [record.name for record in await store.models.list()] == ["a", "b", "c"]


async def test_a_removed_model_is_gone(store: Store) -> None:
    await store.models.add("smollm2", DEFINITION)
    await store.models.remove("smollm2")
    assert await store.models.list() == []
    with pytest.raises(NotFound):
        await store.models.get("smollm2")


async def test_removing_an_unknown_model_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.models.remove("nope")


async def test_records_are_frozen_copies(store: Store) -> None:
    record = await store.models.add("smollm2", DEFINITION)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.name = "other"  # type: ignore[misc]
