"""Replicas: the desired placement of each model."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from llmgw.errors import Conflict, NotFound, NotLeader
from llmgw.store import Fence, ReplicaRecord, Store


def replica(replica_id: str, model: str = "smollm2", devices: Sequence[int] = (0, 1)) -> ReplicaRecord:
    return ReplicaRecord(
        id=replica_id, model=model, node_id="node-1", api_key="engine-key", devices=devices, memory_mb=2048
    )


@pytest.fixture
async def catalog(store: Store) -> Store:
    await store.models.add("smollm2", {})
    await store.models.add("qwen", {})
    return store


async def test_an_added_replica_reads_back_unchanged(catalog: Store) -> None:
    wanted = replica("r1")
    assert await catalog.replicas.add(wanted) == wanted
    assert await catalog.replicas.get("r1") == wanted


async def test_devices_read_back_as_a_tuple(catalog: Store) -> None:
    await catalog.replicas.add(replica("r1", devices=[2, 3]))
    assert (await catalog.replicas.get("r1")).devices == (2, 3)


async def test_list_can_be_narrowed_to_one_model(catalog: Store) -> None:
    await catalog.replicas.add(replica("r1"))
    await catalog.replicas.add(replica("r2", model="qwen"))
    await catalog.replicas.add(replica("r3"))
    assert {r.id for r in await catalog.replicas.list()} == {"r1", "r2", "r3"}
    assert {r.id for r in await catalog.replicas.list(model="smollm2")} == {"r1", "r3"}


async def test_a_replica_of_an_unknown_model_raises_not_found(catalog: Store) -> None:
    with pytest.raises(NotFound, match="'ghost'"):
        await catalog.replicas.add(replica("r1", model="ghost"))


async def test_adding_an_existing_id_raises_conflict(catalog: Store) -> None:
    await catalog.replicas.add(replica("r1"))
    with pytest.raises(Conflict):
        await catalog.replicas.add(replica("r1", model="qwen"))


async def test_a_removed_replica_is_gone(catalog: Store) -> None:
    await catalog.replicas.add(replica("r1"))
    await catalog.replicas.remove("r1")
    with pytest.raises(NotFound):
        await catalog.replicas.get("r1")


async def test_removing_an_unknown_replica_raises_not_found(catalog: Store) -> None:
    with pytest.raises(NotFound):
        await catalog.replicas.remove("nope")


async def test_removing_a_model_removes_its_replicas(catalog: Store) -> None:
    await catalog.replicas.add(replica("r1"))
    await catalog.replicas.add(replica("r2", model="qwen"))
    await catalog.models.remove("smollm2")
    assert [r.id for r in await catalog.replicas.list()] == ["r2"]


async def test_replicas_added_together_read_back_and_those_of_a_model_gone_are_left_out(
    catalog: Store,
) -> None:
    wanted = [replica("r1"), replica("r2", model="qwen"), replica("r3", model="ghost")]
    assert await catalog.replicas.add_all(wanted) == wanted[:2]
    assert {r.id for r in await catalog.replicas.list()} == {"r1", "r2"}


async def test_replicas_added_together_with_an_existing_id_store_none(catalog: Store) -> None:
    await catalog.replicas.add(replica("r1"))
    with pytest.raises(Conflict):
        await catalog.replicas.add_all([replica("r2"), replica("r1", model="qwen")])
    assert [r.id for r in await catalog.replicas.list()] == ["r1"]


async def test_more_replicas_added_together_than_one_statement_binds(catalog: Store) -> None:
    many = [replica(f"r{i:04d}") for i in range(1200)]
    assert len(await catalog.replicas.add_all(many)) == 1200
    assert len(await catalog.replicas.list("smollm2")) == 1200


async def test_replicas_added_together_by_a_control_plane_that_does_not_lead_are_refused(
    catalog: Store,
) -> None:
    catalog.fence = Fence("cp2", None)  # a standby, or a leader deposed
    with pytest.raises(NotLeader):
        await catalog.replicas.add_all([replica("r1"), replica("r2", model="qwen")])
    catalog.fence = None
    assert await catalog.replicas.list() == []
