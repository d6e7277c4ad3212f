"""The leader's state under way: drains, roll surges and the agents' rollout, read back by a new leader."""

from __future__ import annotations

from datetime import timedelta

import pytest

from llmgw.errors import NotLeader
from llmgw.store import Fence, ReplicaRecord, Store
from llmgw.store.leaderstate import DrainRecord, RolloutRecord
from llmgw.testing.clock import FakeClock


def replica(replica_id: str, model: str = "m1") -> ReplicaRecord:
    return ReplicaRecord(id=replica_id, model=model, node_id="node-1", api_key="k", devices=(), memory_mb=512)


@pytest.fixture
async def placed(store: Store) -> Store:
    await store.models.add("m1", {})
    await store.models.add("m2", {})
    await store.replicas.add_all([replica("r1"), replica("r2"), replica("r3", model="m2")])
    return store


async def test_a_drain_begun_reads_back_with_its_time_and_reason(placed: Store, clock: FakeClock) -> None:
    began = clock.utcnow()
    assert await placed.leader_state.begin_drains([DrainRecord("r1", began, "scaled down")]) == ["r1"]
    assert await placed.leader_state.drains() == [DrainRecord("r1", began, "scaled down")]


async def test_a_drain_recorded_twice_keeps_when_it_began(placed: Store, clock: FakeClock) -> None:
    began = clock.utcnow()
    await placed.leader_state.begin_drains([DrainRecord("r1", began, "scaled down")])
    await placed.leader_state.begin_drains([DrainRecord("r1", began + timedelta(seconds=30), "evicted")])
    assert await placed.leader_state.drains() == [DrainRecord("r1", began, "scaled down")]


async def test_a_drain_of_a_replica_no_longer_placed_is_left_out(placed: Store, clock: FakeClock) -> None:
    drains = [DrainRecord("gone", clock.utcnow(), "x"), DrainRecord("r2", clock.utcnow(), "y")]
    assert await placed.leader_state.begin_drains(drains) == ["r2"]
    assert [d.replica_id for d in await placed.leader_state.drains()] == ["r2"]


async def test_removing_a_draining_replica_ends_its_drain(placed: Store, clock: FakeClock) -> None:
    await placed.leader_state.begin_drains([DrainRecord("r1", clock.utcnow(), "scaled down")])
    await placed.replicas.remove("r1")
    assert await placed.leader_state.drains() == []


async def test_drains_read_longest_draining_first(placed: Store, clock: FakeClock) -> None:
    now = clock.utcnow()
    await placed.leader_state.begin_drains([DrainRecord("r2", now, "b")])
    await placed.leader_state.begin_drains([DrainRecord("r1", now - timedelta(seconds=5), "a")])
    assert [d.replica_id for d in await placed.leader_state.drains()] == ["r1", "r2"]


async def test_surges_kept_are_the_whole_set(placed: Store) -> None:
    assert await placed.leader_state.keep_surges({"m1": "r2", "m2": "r3"}) == {"m1": "r2", "m2": "r3"}
    assert await placed.leader_state.keep_surges({"m1": "r1"}) == {"m1": "r1"}
    assert await placed.leader_state.surges() == {"m1": "r1"}
    await placed.leader_state.keep_surges({})
    assert await placed.leader_state.surges() == {}


async def test_a_surge_whose_replica_or_model_is_gone_is_left_out(placed: Store) -> None:
    assert await placed.leader_state.keep_surges({"m1": "ghost", "nomodel": "r1", "m2": "r3"}) == {"m2": "r3"}
    await placed.replicas.remove("r3")
    assert await placed.leader_state.surges() == {}


async def test_removing_a_model_ends_its_surge(placed: Store) -> None:
    await placed.leader_state.keep_surges({"m2": "r3"})
    await placed.models.remove("m2")
    assert await placed.leader_state.surges() == {}


async def test_a_rollout_reads_back_as_it_was_kept_and_a_new_one_replaces_it(
    store: Store, clock: FakeClock
) -> None:
    assert await store.leader_state.rollout() is None
    started = RolloutRecord("2.0.0", "SUMS", "SIG", ("n1", "n2"), started_at=clock.utcnow())
    await store.leader_state.keep_rollout(started)
    assert await store.leader_state.rollout() == started
    step = RolloutRecord(
        "2.0.0", "SUMS", "SIG", ("n1", "n2"), started_at=started.started_at, upgraded=("n1",),
        current="n2", current_since=clock.utcnow() + timedelta(seconds=9),
    )  # fmt: skip
    await store.leader_state.keep_rollout(step)
    assert await store.leader_state.rollout() == step
    other = RolloutRecord("3.0.0", "S3", "G3", ("n2",), started_at=clock.utcnow(), error="x", finished=True)
    await store.leader_state.keep_rollout(other)
    assert await store.leader_state.rollout() == other


async def test_a_control_plane_that_does_not_lead_writes_none_of_it(placed: Store, clock: FakeClock) -> None:
    placed.fence = Fence("cp2", None)  # a standby, or a leader deposed
    with pytest.raises(NotLeader):
        await placed.leader_state.begin_drains([DrainRecord("r1", clock.utcnow(), "scaled down")])
    with pytest.raises(NotLeader):
        await placed.leader_state.keep_surges({"m1": "r1"})
    with pytest.raises(NotLeader):
        await placed.leader_state.keep_rollout(RolloutRecord("2.0.0", "S", "G", ("n1",), clock.utcnow()))
    placed.fence = None
    assert await placed.leader_state.drains() == []
    assert await placed.leader_state.surges() == {}
    assert await placed.leader_state.rollout() is None
