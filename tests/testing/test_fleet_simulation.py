"""The simulated fleet: nodes register with an in-process leader through the real sessions and
channels, and a model placed on them becomes ready."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.nodes.fleet import ReplicaState
from llmgw.core.shards import ReplicaPhase, ShardState
from llmgw.testing.eventually import eventually
from llmgw.testing.fleet_simulation import InProcessControlPlane, SimulatedFleet, simulated_inventory


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[tuple[InProcessControlPlane, dict[str, str]]]:
    ready: dict[str, str] = {}

    def on_ready(replica: ReplicaState, url: str) -> None:
        ready[replica.replica_id] = url

    control = await InProcessControlPlane.open(
        f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}",
        on_ready=on_ready,
        on_gone=lambda r: ready.pop(r, None),
    )
    yield control, ready
    await control.close()


def test_a_simulated_node_has_eight_80g_cards() -> None:
    inventory = simulated_inventory("sim-0001")
    assert [gpu.memory_free_mb for gpu in inventory.gpus] == [81920] * 8
    assert inventory.node_id == "sim-0001"


async def test_every_simulated_node_registers(plane: tuple[InProcessControlPlane, dict[str, str]]) -> None:
    control, _ = plane
    fleet = SimulatedFleet(12, [control.ADDRESS], control.connect_of)
    fleet.start()
    try:
        await eventually(lambda: fleet.registered() == 12 and len(control.fleet.nodes) == 12)
        assert sorted(control.fleet.nodes) == [f"sim-{n:04d}" for n in range(12)]
        assert all(len(node.inventory.gpus) == 8 for node in control.fleet.nodes.values())
    finally:
        await fleet.stop()


async def test_a_model_is_placed_and_its_replicas_become_ready(
    plane: tuple[InProcessControlPlane, dict[str, str]],
) -> None:
    control, ready = plane
    fleet = SimulatedFleet(3, [control.ADDRESS], control.connect_of)
    fleet.start()
    try:
        await eventually(lambda: len(control.fleet.nodes) == 3)
        definition = {
            "name": "m1",
            "source": {"sha256": "a" * 64, "size": 10 << 30},
            "replicas": {"min": 3, "max": 3},
        }
        await control.store.models.add("m1", definition)
        await control.reconciler.pass_once()
        await eventually(lambda: len(ready) == 3)
        replicas = control.fleet.of_model("m1")
        assert {r.state for r in replicas} == {ReplicaPhase.READY}
        assert len({r.node_id for r in replicas}) == 3  # spread: one per node
        shards = [s for node in fleet.nodes for s in node.shards.shards.values()]
        assert [s.state for s in shards] == [ShardState.READY] * 3
    finally:
        await fleet.stop()
