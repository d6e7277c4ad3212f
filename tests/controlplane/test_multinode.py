"""Multi-node replicas in the reconciler: placed whole, started together, taken down whole (C5.5)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.multinode import rank_of, rendezvous_port
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.clock import FakeClock

SHA = "a" * 64
TWO_NODES = {"engine": "vllm", "tp": 2, "pp": 2, "nodes": 2, "memory_mb": 40000}


@dataclass
class Harness:
    store: Store
    reconciler: Reconciler
    sessions: NodeSessions
    ready: dict[str, str] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def connect(self, node_id: str, cards: int = 2):  # type: ignore[no-untyped-def]
        agent, control = memory_pair(agent_name=node_id)
        self.tasks.append(asyncio.create_task(self.sessions.serve(control)))
        devices = [
            pb.Device(kind="nvidia", index=i, name="NVIDIA L40S", memory_mb=46068, memory_free_mb=46068)
            for i in range(cards)
        ]
        register = pb.Register(
            node_id=node_id, address=f"{node_id}.lan", cpu_cores=8, memory_mb=65536, devices=devices
        )
        await agent.send(pb.AgentMessage(register=register))
        await receive(agent, "registered")
        return agent

    async def add_model(self, name: str, profile: dict[str, object]) -> None:
        source = {"sha256": SHA, "format": "safetensors", "size": 100 << 20}
        await self.store.models.add(name, {"name": name, "source": source, "profile": profile})


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    ready: dict[str, str] = {}
    fleet = Fleet(
        on_ready=lambda r, url: ready.__setitem__(r.replica_id, url),
        on_gone=lambda replica_id: ready.pop(replica_id, None),
        clock=FakeClock(),
    )
    reconciler = Reconciler(store, fleet, clock=FakeClock())
    leadership = Leadership(Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://x"))
    await leadership.round()
    h = Harness(store, reconciler, NodeSessions(store, fleet, reconciler, leadership), ready)
    yield h
    for task in h.tasks:
        task.cancel()
    await asyncio.gather(*h.tasks, return_exceptions=True)  # sessions end before the store closes
    await store.close()


async def receive(agent, kind: str) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message


async def report(
    agent, replica_id: str, state: int, port: int = 0, error: str = "", restarts: int = 0
) -> None:  # type: ignore[no-untyped-def]
    """The node reports a shard's state, and the control plane has taken it in."""
    status = pb.ShardStatus(replica_id=replica_id, state=state, port=port, error=error, restarts=restarts)  # type: ignore[arg-type]
    await agent.send(pb.AgentMessage(status=status))
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")


async def place_two_node_replica(harness: Harness):  # type: ignore[no-untyped-def]
    await harness.add_model("big", TWO_NODES)
    agents = {"a": await harness.connect("a"), "b": await harness.connect("b")}
    await harness.reconciler.pass_once()
    starts = {node: (await receive(agent, "start")).start for node, agent in agents.items()}
    return agents, starts


async def test_a_two_node_replica_starts_one_shard_on_each_node_with_its_rank_and_the_heads_address(
    harness: Harness,
) -> None:
    agents, starts = await place_two_node_replica(harness)
    head = next(s for s in starts.values() if s.rank == 0)
    member = next(s for s in starts.values() if s.rank == 1)
    head_node = next(node for node, s in starts.items() if s.rank == 0)
    assert rank_of(member.replica_id) == (head.replica_id, 1)
    assert (head.nodes, member.nodes) == (2, 2)
    assert head.rendezvous == member.rendezvous == f"{head_node}.lan:{rendezvous_port(head.replica_id)}"
    assert (head.tp, head.pp, list(head.devices), list(member.devices)) == (2, 2, [0, 1], [0, 1])
    assert head.api_key == member.api_key
    records = {r.id: r for r in await harness.store.replicas.list()}
    assert set(records) == {head.replica_id, member.replica_id}
    assert records[head.replica_id].memory_mb == 20000  # each node holds half
    # only the head is routed to, once it serves (it serves once every rank has joined)
    member_node = "b" if head_node == "a" else "a"
    await report(agents[member_node], member.replica_id, pb.SHARD_STATE_READY, port=21001)
    assert harness.ready == {}
    await report(agents[head_node], head.replica_id, pb.SHARD_STATE_READY, port=21002)
    assert harness.ready == {head.replica_id: f"http://{head_node}.lan:21002"}


async def test_a_failing_shard_takes_the_replica_down_and_it_is_placed_again(harness: Harness) -> None:
    agents, starts = await place_two_node_replica(harness)
    head = next(s for s in starts.values() if s.rank == 0)
    head_node = next(node for node, s in starts.items() if s.rank == 0)
    member_node = "b" if head_node == "a" else "a"
    await report(agents[head_node], head.replica_id, pb.SHARD_STATE_READY, port=21002)
    await report(agents[member_node], starts[member_node].replica_id, pb.SHARD_STATE_READY, port=21001)
    assert head.replica_id in harness.ready
    # the member's engine exits: its agent restarts it, which a rank cannot do alone
    await report(
        agents[member_node], starts[member_node].replica_id, pb.SHARD_STATE_STARTING, error="exited 1"
    )
    await harness.reconciler.pass_once()
    stopped = {node: (await receive(agent, "stop")).stop for node, agent in agents.items()}
    assert {s.replica_id for s in stopped.values()} == {head.replica_id, starts[member_node].replica_id}
    assert "was restarted by its node: exited 1" in stopped[head_node].reason
    assert harness.ready == {}
    again = {node: (await receive(agent, "start")).start for node, agent in agents.items()}
    assert {s.rank for s in again.values()} == {0, 1}
    new_head = next(s for s in again.values() if s.rank == 0)
    assert new_head.replica_id != head.replica_id
    assert {r.id for r in await harness.store.replicas.list()} == {s.replica_id for s in again.values()}


async def test_a_failed_shard_takes_the_replica_down_too(harness: Harness) -> None:
    agents, starts = await place_two_node_replica(harness)
    head_node = next(node for node, s in starts.items() if s.rank == 0)
    await report(agents[head_node], starts[head_node].replica_id, pb.SHARD_STATE_FAILED, error="port taken")
    await harness.reconciler.pass_once()
    for agent in agents.values():
        assert "failed: port taken" in (await receive(agent, "stop")).stop.reason


async def test_a_two_node_replica_waits_while_one_node_has_the_cards(harness: Harness) -> None:
    await harness.add_model("big", TWO_NODES)
    await harness.connect("a")
    await harness.connect("b", cards=1)
    await harness.reconciler.pass_once()
    reasons = harness.reconciler.unplaced["big"]
    assert "a: fits one shard (20000 MiB on 2 cards), but a replica spans 2 nodes and only 1 has" in reasons
    assert "b: needs 2 cards with 10000 MiB free each; 1 there" in reasons
    assert await harness.store.replicas.list() == []


async def test_stopping_the_model_stops_every_shard(harness: Harness) -> None:
    agents, starts = await place_two_node_replica(harness)
    await harness.store.models.remove("big")
    await harness.reconciler.pass_once()
    for node, agent in agents.items():
        assert (await receive(agent, "stop")).stop.replica_id == starts[node].replica_id


async def test_a_shard_restarted_and_ready_again_between_passes_still_takes_the_replica_down(
    harness: Harness,
) -> None:
    agents, starts = await place_two_node_replica(harness)
    member_node = next(node for node, s in starts.items() if s.rank == 1)
    member = starts[member_node].replica_id
    await report(agents[member_node], member, pb.SHARD_STATE_READY, port=21001, restarts=1)
    await harness.reconciler.pass_once()
    for agent in agents.values():
        assert "was restarted by its node" in (await receive(agent, "stop")).stop.reason
