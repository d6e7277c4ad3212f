"""The audit log: actions appended, read back newest first."""

from __future__ import annotations

from llmgw.store import Store
from llmgw.testing.clock import FakeClock


async def test_a_recorded_action_reads_back(store: Store, clock: FakeClock) -> None:
    entry = await store.audit.record("alice", "models.add", "smollm2", {"profiles": 1})
    assert await store.audit.list() == [entry]
    assert (entry.at, entry.actor, entry.action, entry.target, entry.detail) == (
        clock.utcnow(),
        "alice",
        "models.add",
        "smollm2",
        {"profiles": 1},
    )


async def test_detail_defaults_to_an_empty_dict(store: Store) -> None:
    assert (await store.audit.record("alice", "keys.revoke", "key_1")).detail == {}


async def test_list_returns_the_newest_first_up_to_the_limit(store: Store) -> None:
    for index in range(5):
        await store.audit.record("alice", "settings.set", f"k{index}")
    assert [entry.target for entry in await store.audit.list(limit=3)] == ["k4", "k3", "k2"]
