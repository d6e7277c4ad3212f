"""A pass's placements: written to the store in one transaction, then started; forgotten when not written."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from llmgw.controlplane.nodes.fleet import ReplicaState
from llmgw.controlplane.replicas.placing import Placer
from llmgw.controlplane.replicas.reconciletracing import NO_PASS
from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.shards import ReplicaPhase
from llmgw.errors import Conflict
from llmgw.store.replicas import ReplicaRecord

from .test_reconciling import SHA, Harness, harness, receive

__all__ = ["harness"]


def model(name: str) -> ModelDefinition:
    return parse_model({"name": name, "source": {"sha256": SHA, "size": 100 << 20}})


def placer(harness: Harness) -> Placer:
    return Placer(harness.fleet, definitions=dict, training_holds=tuple, drain=lambda replica, why: None)


async def test_a_pass_writes_its_placements_in_one_transaction_before_telling_any_node(
    harness: Harness,
) -> None:
    for name in ("m1", "m2", "m3"):
        await harness.add_model(name)
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    seen: list[tuple[str, list[ReplicaPhase]]] = []

    def executed(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO REPLICAS"):
            seen.append(("insert", [r.state for r in harness.fleet.replicas.values()]))

    engine = harness.store.engine.sync_engine
    event.listen(engine, "before_cursor_execute", executed)
    event.listen(engine, "commit", lambda conn: seen.append(("commit", [])))
    await harness.reconciler.pass_once()
    inserts = [i for i, (what, _) in enumerate(seen) if what == "insert"]
    assert inserts, "the pass wrote no replica"
    assert all(what == "insert" for what, _ in seen[inserts[0] : inserts[-1] + 1])  # no commit between
    assert all(states == [ReplicaPhase.PLACED] * 3 for what, states in seen if what == "insert")
    starts = {(await receive(agent, "start")).start.model for _ in range(3)}
    assert starts == {"m1", "m2", "m3"}
    assert sorted(r.model for r in await harness.store.replicas.list()) == ["m1", "m2", "m3"]


async def test_a_placement_whose_model_left_the_catalog_meanwhile_is_forgotten_not_started(
    harness: Harness,
) -> None:
    for name in ("m1", "m2"):
        await harness.add_model(name)
    await receive(await harness.connect("node1"), "registered")
    placing, placed = placer(harness), []
    assert placing.place(model("m1"), placed, NO_PASS) and placing.place(model("m2"), placed, NO_PASS)
    await harness.store.models.remove("m2")
    started: list[str] = []

    async def start(replica: ReplicaState, definition: ModelDefinition, devices: tuple[int, ...]) -> None:
        started.append(replica.model)

    await placing.flush(harness.store, start)
    assert started == ["m1"]
    assert [r.model for r in harness.fleet.replicas.values()] == ["m1"]
    assert [r.model for r in await harness.store.replicas.list()] == ["m1"]


async def test_placements_whose_write_fails_are_all_forgotten_and_none_started(harness: Harness) -> None:
    for name in ("m1", "m2"):
        await harness.add_model(name)
    await receive(await harness.connect("node1"), "registered")
    placing, placed = placer(harness), []
    assert placing.place(model("m1"), placed, NO_PASS) and placing.place(model("m2"), placed, NO_PASS)
    taken = placed[1]
    await harness.store.replicas.add(ReplicaRecord(taken.id, "m2", "node1", "key", (), 1))
    started: list[str] = []

    async def start(replica: ReplicaState, definition: ModelDefinition, devices: tuple[int, ...]) -> None:
        started.append(replica.model)

    with pytest.raises(Conflict):
        await placing.flush(harness.store, start)
    assert started == [] and harness.fleet.replicas == {}
    assert [r.id for r in await harness.store.replicas.list()] == [taken.id]


async def test_placements_of_a_pass_that_ended_before_writing_them_are_forgotten(harness: Harness) -> None:
    await harness.add_model("m1")
    await receive(await harness.connect("node1"), "registered")
    placing = placer(harness)
    assert placing.place(model("m1"), [], NO_PASS)
    assert len(harness.fleet.replicas) == 1
    placing.abandon()
    assert harness.fleet.replicas == {}
    assert await harness.store.replicas.list() == []
