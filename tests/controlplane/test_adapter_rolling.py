"""Adding an adapter to a model whose engine loads adapters only at start rolls its replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.adapterrolling import RollStep, roll_step, stale
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.catalog import parse_model
from llmgw.core.shards import ReplicaPhase
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

SHA = "a" * 64
TONE_SHA = "b" * 64
MODEL: dict[str, Any] = {"name": "m1", "source": {"sha256": SHA, "size": 100 << 20}}
WITH_TONE: dict[str, Any] = {**MODEL, "adapters": [{"name": "tone", "sha256": TONE_SHA}]}


@dataclass
class Harness:
    store: Store
    fleet: Fleet
    reconciler: Reconciler
    sessions: NodeSessions
    ready: dict[str, str]
    drained: list[str] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def connect(self, node_id: str, memory_mb: int):  # type: ignore[no-untyped-def]
        agent, control = memory_pair(agent_name=node_id)
        self.tasks.append(asyncio.create_task(self.sessions.serve(control)))
        register = pb.Register(node_id=node_id, address="127.0.0.1", cpu_cores=4, memory_mb=memory_mb)
        await agent.send(pb.AgentMessage(register=register))
        await receive(agent, "registered")
        return agent

    async def ready_with(self, agent, start: pb.StartShard, paths: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
        status = pb.ShardStatus(
            replica_id=start.replica_id, state=pb.SHARD_STATE_READY, port=21001, adapter_paths=paths
        )
        await agent.send(pb.AgentMessage(status=status))
        await eventually(lambda: start.replica_id in self.ready, message="the replica is ready")


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    clock = FakeClock()
    ready: dict[str, str] = {}
    fleet = Fleet(
        on_ready=lambda r, url: ready.__setitem__(r.replica_id, url),
        on_gone=lambda replica_id: ready.pop(replica_id, None),
        clock=clock,
    )
    drained: list[str] = []
    reconciler = Reconciler(store, fleet, clock=clock, drain=drained.append)
    leadership = Leadership(
        Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")
    )
    await leadership.round()
    sessions = NodeSessions(store, fleet, reconciler, leadership)
    h = Harness(store, fleet, reconciler, sessions, ready, drained)
    yield h
    for task in h.tasks:
        task.cancel()
    await asyncio.gather(*h.tasks, return_exceptions=True)
    await store.close()


async def receive(agent, kind: str) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    """The next message of ``kind``, skipping others."""
    async with asyncio.timeout(5):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message


def _memory_mb(definition: dict[str, Any]) -> int:
    model = parse_model(definition)
    return model.memory_needed_mb(model.profiles[0])


@pytest.mark.parametrize(
    "replicas", [{"min": 1, "max": 1}, {"min": 1, "max": 3}], ids=["fixed", "autoscaled"]
)
async def test_adding_an_adapter_starts_a_replica_with_it_then_drains_the_old_one(
    harness: Harness, replicas: dict[str, int]
) -> None:
    """Autoscaled, the extra replica is not counted as wanted: the roll ends where it began."""
    await harness.store.models.add("m1", {**MODEL, "replicas": replicas})
    agent = await harness.connect("node1", memory_mb=8192)
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start
    await harness.ready_with(agent, first, {})
    await harness.reconciler.pass_once()
    assert harness.fleet.replicas[first.replica_id].adapters == ()

    await harness.store.models.put("m1", {**WITH_TONE, "replicas": replicas})  # the adapter added
    await harness.reconciler.pass_once()
    surge = (await receive(agent, "start")).start
    assert [a.name for a in surge.adapters] == ["tone"]
    assert harness.fleet.replicas[first.replica_id].draining_since is None  # it serves meanwhile
    await harness.reconciler.pass_once()  # the new one still starting: the old one keeps serving
    assert not harness.drained and len(harness.fleet.replicas) == 2

    await harness.ready_with(agent, surge, {"tone": "/w/tone.gguf"})
    await harness.reconciler.pass_once()
    assert harness.drained == [first.replica_id]
    stop = (await receive(agent, "stop")).stop  # no request was on it: stopped in the same pass
    assert stop.replica_id == first.replica_id
    assert stop.reason.startswith("started without adapter(s) tone; a replica started with")
    assert set(harness.fleet.replicas) == {surge.replica_id}
    await harness.reconciler.pass_once()  # rolled: nothing more to do
    assert harness.drained == [first.replica_id] and set(harness.fleet.replicas) == {surge.replica_id}


async def test_without_room_for_one_more_the_old_replica_is_drained_and_then_replaced(
    harness: Harness,
) -> None:
    await harness.store.models.add("m1", MODEL)
    agent = await harness.connect("node1", memory_mb=_memory_mb(MODEL) * 3 // 2)  # room for one
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start
    await harness.ready_with(agent, first, {})
    await harness.store.models.put("m1", WITH_TONE)
    await harness.reconciler.pass_once()
    assert harness.drained == [first.replica_id]
    assert (await receive(agent, "stop")).stop.replica_id == first.replica_id
    await harness.reconciler.pass_once()
    second = (await receive(agent, "start")).start
    assert [a.name for a in second.adapters] == ["tone"]


async def test_a_runtime_adapter_model_keeps_its_replicas(harness: Harness) -> None:
    runtime = {
        **WITH_TONE,
        "source": {"sha256": SHA, "size": 100 << 20, "format": "safetensors"},
        "profile": {"engine": "vllm", "max_loaded_adapters": 1},
    }
    await harness.store.models.add("m1", {**runtime, "adapters": []})
    agent = await harness.connect("node1", memory_mb=1 << 20)
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start
    await harness.ready_with(agent, first, {})
    await harness.store.models.put("m1", runtime)  # vLLM loads it at run time: nothing to replace
    await harness.reconciler.pass_once()
    await harness.reconciler.pass_once()
    assert not harness.drained and set(harness.fleet.replicas) == {first.replica_id}


def _replica(name: str, adapters: tuple[str, ...] | None, state: ReplicaPhase) -> ReplicaState:
    return ReplicaState(name, "m1", "n1", "key", state=state, adapters=adapters)


def test_the_roll_waits_for_a_fresh_replica_and_drains_the_stale_one_least_worth_keeping() -> None:
    model = parse_model(WITH_TONE)
    ready_old = _replica("a", (), ReplicaPhase.READY)
    failed_old = _replica("b", (), ReplicaPhase.FAILED)
    unknown = _replica("c", None, ReplicaPhase.STARTING)  # taken over, not reported ready yet
    fresh = _replica("d", ("tone",), ReplicaPhase.STARTING)
    old = stale(model, [ready_old, failed_old, unknown, fresh])
    assert old == [ready_old, failed_old]
    assert roll_step([ready_old, failed_old], old, want=2) == RollStep(surge=True)
    assert roll_step([ready_old, failed_old, fresh], old, want=2) == RollStep()  # still starting
    fresh.state = ReplicaPhase.READY
    assert roll_step([ready_old, failed_old, fresh], old, want=2) == RollStep(drain=(failed_old,))
    assert roll_step([ready_old], [ready_old], want=2) == RollStep()  # too few: placed as ever
    removed = _replica("e", ("tone", "gone"), ReplicaPhase.READY)
    assert stale(model, [removed]) == [removed]  # llama.cpp's adapter ids follow the catalog's order


async def test_a_pass_whose_placements_are_spent_leaves_the_roll_to_the_next_pass_and_drains_nothing(
    tmp_path: Path,
) -> None:
    """One placement a pass, taken by a model of higher priority: the roll's extra replica waits for
    the next pass, and the old replica keeps serving (it is not replaced in place for want of room)."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    ready: dict[str, str] = {}
    fleet = Fleet(
        on_ready=lambda r, url: ready.__setitem__(r.replica_id, url),
        on_gone=lambda replica_id: ready.pop(replica_id, None),
    )
    drained: list[str] = []
    reconciler = Reconciler(store, fleet, drain=drained.append, placements_per_pass=1)
    leadership = Leadership(Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://x"))
    await leadership.round()
    h = Harness(store, fleet, reconciler, NodeSessions(store, fleet, reconciler, leadership), ready, drained)
    try:
        await store.models.add("m1", MODEL)
        agent = await h.connect("node1", memory_mb=65536)
        await reconciler.pass_once()
        first = (await receive(agent, "start")).start
        await h.ready_with(agent, first, {})

        await store.models.put("m1", WITH_TONE)
        urgent = {"name": "urgent", "source": {"sha256": SHA, "size": 100 << 20}, "priority": 10}
        await store.models.add("urgent", urgent)
        await reconciler.pass_once()
        assert (await receive(agent, "start")).start.model == "urgent"
        assert reconciler.more_to_place and not drained
        assert fleet.replicas[first.replica_id].draining_since is None

        await reconciler.pass_once()
        surge = (await receive(agent, "start")).start
        assert surge.model == "m1" and [a.name for a in surge.adapters] == ["tone"]
        assert not drained and not reconciler.more_to_place
    finally:
        for task in h.tasks:
            task.cancel()
        await asyncio.gather(*h.tasks, return_exceptions=True)
        await store.close()


async def test_a_replica_loading_adapters_at_run_time_is_sent_a_new_adapter_not_rolled(
    harness: Harness,
) -> None:
    source = {**MODEL["source"], "format": "safetensors", "filename": "model.safetensors"}
    runtime: dict[str, Any] = {
        **MODEL,
        "source": source,
        "profile": {"engine": "vllm", "max_loaded_adapters": 2},
    }
    await harness.store.models.add("m1", runtime)
    agent = await harness.connect("node1", memory_mb=8192)
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start
    await harness.ready_with(agent, first, {})
    await harness.reconciler.pass_once()

    peft = {"name": "tone", "sha256": TONE_SHA, "filename": "adapter_model.safetensors",
            "files": [{"sha256": "c" * 64, "filename": "adapter_config.json"}]}  # fmt: skip
    await harness.store.models.put("m1", {**runtime, "adapters": [peft]})  # a trained adapter published
    await harness.reconciler.pass_once()
    again = (await receive(agent, "start")).start  # its start again: the agent fetches the adapter
    assert again.replica_id == first.replica_id and [a.name for a in again.adapters] == ["tone"]
    assert harness.fleet.replicas[first.replica_id].adapters == ("tone",)
    assert set(harness.fleet.replicas) == {first.replica_id} and not harness.drained  # no roll
    assert harness.fleet.replicas[first.replica_id].state is ReplicaPhase.READY
    await harness.reconciler.pass_once()  # sent once
    with pytest.raises(TimeoutError):
        await receive(agent, "start")
