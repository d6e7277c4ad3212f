"""Nodes: registrations remembered across restarts."""

from __future__ import annotations

import pytest

from llmgw.errors import NotFound
from llmgw.store import Store
from llmgw.testing.clock import FakeClock

INVENTORY = {"devices": [{"index": 0, "memory_mb": 81920}], "memory_mb": 262144}


async def test_a_new_node_is_first_and_last_seen_now(store: Store, clock: FakeClock) -> None:
    node = await store.nodes.upsert("node-1", "10.0.0.5:7001", INVENTORY)
    assert node.first_seen == node.last_seen == clock.utcnow()
    assert await store.nodes.get("node-1") == node


async def test_a_known_node_keeps_first_seen_and_takes_the_new_report(store: Store, clock: FakeClock) -> None:
    first = await store.nodes.upsert("node-1", "10.0.0.5:7001", INVENTORY)
    await clock.advance(30)
    later = clock.utcnow()
    again = await store.nodes.upsert("node-1", "10.0.0.6:7001", {"devices": []})
    assert again.first_seen == first.first_seen
    assert again.last_seen == later
    assert (again.address, again.inventory) == ("10.0.0.6:7001", {"devices": []})


async def test_an_unknown_node_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="'node-9'"):
        await store.nodes.get("node-9")


async def test_list_returns_every_node_by_id(store: Store) -> None:
    for node_id in ("b", "a"):
        await store.nodes.upsert(node_id, "host", {})
    assert [node.id for node in await store.nodes.list()] == ["a", "b"]


async def test_many_registrations_are_recorded_as_one_by_one(store: Store, clock: FakeClock) -> None:
    first = await store.nodes.upsert("node-1", "10.0.0.5:7001", INVENTORY)
    await clock.advance(30)
    await store.nodes.upsert_many(
        [("node-1", "10.0.0.6:7001", {"devices": []}), ("node-2", "10.0.0.7:7001", INVENTORY)]
    )
    again, new = await store.nodes.get("node-1"), await store.nodes.get("node-2")
    assert (again.first_seen, again.last_seen) == (first.first_seen, clock.utcnow())
    assert (again.address, again.inventory) == ("10.0.0.6:7001", {"devices": []})
    assert new.first_seen == new.last_seen == clock.utcnow()
    assert (new.address, new.inventory) == ("10.0.0.7:7001", INVENTORY)
    await store.nodes.upsert_many([])
    assert [node.id for node in await store.nodes.list()] == ["node-1", "node-2"]
