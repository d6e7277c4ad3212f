"""Nodes' registrations are written to the store in batches, the latest of each node winning."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.nodes.noderecording import NodeRecords
from llmgw.store.database import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    yield opened
    await opened.close()


async def test_registrations_arriving_together_are_one_transaction(store: Store) -> None:
    records = NodeRecords(store)
    for n in range(50):
        records.record(f"node-{n:02d}", f"10.0.0.{n}", {"memory_mb": n})
    await records.flushed()
    nodes = await store.nodes.list()
    assert [(node.id, node.address, node.inventory) for node in nodes] == [
        (f"node-{n:02d}", f"10.0.0.{n}", {"memory_mb": n}) for n in range(50)
    ]
    assert records.batches == 1
    await records.close()


async def test_a_registration_arriving_during_a_write_goes_in_the_next_with_the_latest_winning(
    store: Store,
) -> None:
    records = NodeRecords(store)
    records.record("node-1", "10.0.0.1", {})
    records.record("node-1", "10.0.0.2", {})  # the same node again before the write: the latest wins
    await records.flushed()
    records.record("node-2", "10.0.0.3", {})
    await records.flushed()
    assert [(node.id, node.address) for node in await store.nodes.list()] == [
        ("node-1", "10.0.0.2"),
        ("node-2", "10.0.0.3"),
    ]
    assert records.batches == 2
    await records.close()


async def test_a_batch_the_store_refuses_is_logged_and_the_session_goes_on(
    store: Store, tmp_path: Path
) -> None:
    closed = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'gone.db'}")
    await closed.close()
    records = NodeRecords(closed)
    records.record("node-1", "10.0.0.1", {})
    await records.flushed()  # logged, not raised: the node's session goes on
    assert records.batches == 0
    await records.close()
