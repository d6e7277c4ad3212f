"""The reconciler's autoscaling, drain, eviction by priority and profiles, over an in-memory stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.scaling import ModelLoad
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.clock import FakeClock

SHA = "a" * 64


@dataclass
class Gateway:
    """What the reconciler reads from and tells the gateway."""

    loads: dict[str, ModelLoad] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    drained: list[str] = field(default_factory=list)
    ready: dict[str, str] = field(default_factory=dict)

    def drain(self, replica_id: str) -> None:
        self.drained.append(replica_id)
        self.ready.pop(replica_id, None)


@dataclass
class Harness:
    store: Store
    reconciler: Reconciler
    sessions: NodeSessions
    clock: FakeClock
    gateway: Gateway
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def connect(self, node_id: str, memory_mb: int = 8192):  # type: ignore[no-untyped-def]
        agent, control = memory_pair(agent_name=node_id)
        self.tasks.append(asyncio.create_task(self.sessions.serve(control)))
        register = pb.Register(node_id=node_id, address="127.0.0.1", cpu_cores=4, memory_mb=memory_mb)
        await agent.send(pb.AgentMessage(register=register))
        await receive(agent, "registered")
        return agent

    async def add_model(self, name: str, **fields: object) -> None:
        await self.store.models.add(
            name, {"name": name, "source": {"sha256": SHA, "size": 100 << 20}, **fields}
        )


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    clock = FakeClock()
    gateway = Gateway()
    fleet = Fleet(
        on_ready=lambda r, url: gateway.ready.__setitem__(r.replica_id, url),
        on_gone=lambda replica_id: gateway.ready.pop(replica_id, None),
        clock=clock,
    )
    reconciler = Reconciler(
        store,
        fleet,
        clock=clock,
        load=lambda model: gateway.loads.get(model, ModelLoad()),
        drain=gateway.drain,
        replica_in_flight=lambda replica_id: gateway.in_flight.get(replica_id, 0),
    )
    leadership = Leadership(Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://x"))
    await leadership.round()
    h = Harness(store, reconciler, NodeSessions(store, fleet, reconciler, leadership), clock, gateway)
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


async def ready(agent, replica_id: str, port: int) -> None:  # type: ignore[no-untyped-def]
    """The node reports the replica ready, and the control plane has taken it in."""
    status = pb.ShardStatus(replica_id=replica_id, state=pb.SHARD_STATE_READY, port=port)
    await agent.send(pb.AgentMessage(status=status))
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")


SCALING = {"min": 1, "max": 2, "scale_up_cooldown_s": 0, "scale_down_cooldown_s": 60, "drain_timeout_s": 30}


async def test_load_adds_a_replica_and_calm_drains_it_once_its_requests_are_done(harness: Harness) -> None:
    await harness.add_model("m", replicas=SCALING)
    agent = await harness.connect("node1")
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start.replica_id
    await ready(agent, first, 21001)
    harness.gateway.loads["m"] = ModelLoad(ready=1, slots=4, running=4, waiting=3)
    await harness.reconciler.pass_once()
    second = (await receive(agent, "start")).start.replica_id
    assert harness.reconciler.scaling["m"] == "up from 1 to 2: 3 request(s) waiting"
    await ready(agent, second, 21002)
    assert set(harness.gateway.ready) == {first, second}

    harness.gateway.loads["m"] = ModelLoad(ready=2, slots=8, running=1)
    await harness.reconciler.pass_once()
    await harness.clock.advance(59)
    await harness.reconciler.pass_once()
    assert harness.gateway.drained == []  # calm, but not for the whole cool-down yet
    await harness.clock.advance(1)
    harness.gateway.in_flight = {first: 1, second: 1}
    await harness.reconciler.pass_once()
    (victim,) = harness.gateway.drained
    assert len(await harness.store.replicas.list()) == 2  # draining, not stopped: a request is on it
    await ready(agent, victim, 21003)  # a report of the draining replica does not route to it again
    assert victim not in harness.gateway.ready
    await harness.reconciler.pass_once()
    harness.gateway.in_flight[victim] = 0
    await harness.reconciler.pass_once()
    stop = (await receive(agent, "stop")).stop
    assert stop.replica_id == victim
    assert stop.reason.startswith("scaled down: down from 2 to 1")
    assert stop.reason.endswith("(drained)")
    assert [r.id for r in await harness.store.replicas.list()] == [({first, second} - {victim}).pop()]


async def test_a_drain_ends_at_its_timeout_with_requests_left(harness: Harness) -> None:
    await harness.add_model("m", replicas=SCALING | {"scale_down_cooldown_s": 0})
    agent = await harness.connect("node1")
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start.replica_id
    await ready(agent, first, 21001)
    harness.gateway.loads["m"] = ModelLoad(ready=1, slots=4, running=4)
    await harness.reconciler.pass_once()
    second = (await receive(agent, "start")).start.replica_id
    await ready(agent, second, 21002)
    harness.gateway.loads["m"] = ModelLoad(ready=2, slots=8, running=0)
    harness.gateway.in_flight = {first: 2, second: 2}
    await harness.reconciler.pass_once()
    (victim,) = harness.gateway.drained
    await harness.clock.advance(29)
    await harness.reconciler.pass_once()
    await harness.clock.advance(1)
    await harness.reconciler.pass_once()
    stop = (await receive(agent, "stop")).stop
    assert (stop.replica_id, stop.reason.endswith("(2 request(s) still on it after 30 s)")) == (victim, True)


async def test_a_higher_priority_evicts_a_lower_one_and_never_the_reverse(harness: Harness) -> None:
    await harness.add_model("low", profile={"memory_mb": 6000})
    agent = await harness.connect("node1", memory_mb=8192)
    await harness.reconciler.pass_once()
    low = (await receive(agent, "start")).start.replica_id
    await ready(agent, low, 21001)
    harness.gateway.in_flight[low] = 1
    await harness.add_model("high", priority=5, profile={"memory_mb": 6000})
    await harness.reconciler.pass_once()
    assert harness.gateway.drained == [low]
    assert harness.reconciler.evictions["high"] == f"evicting {low} on node1"
    assert "evicting" in harness.reconciler.unplaced["high"]
    await harness.reconciler.pass_once()  # still draining: nothing more is evicted, nothing placed
    assert harness.gateway.drained == [low]
    assert harness.reconciler.evictions["high"] == f"waiting for {low} to drain on node1"
    harness.gateway.in_flight[low] = 0
    await harness.reconciler.pass_once()
    assert (await receive(agent, "stop")).stop.replica_id == low
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert start.model == "high"
    await harness.reconciler.pass_once()
    assert [r.model for r in await harness.store.replicas.list()] == ["high"]
    assert "needs 6000 MiB" in harness.reconciler.unplaced["low"]
    assert "low" not in harness.reconciler.evictions  # high's priority is not below low's


async def test_a_replica_runs_the_first_profile_that_fits_and_keeps_it(harness: Harness) -> None:
    profiles = [{"memory_mb": 16000, "ctx_size": 8192}, {"memory_mb": 2000, "ctx_size": 2048}]
    await harness.add_model("m", profiles=profiles)
    agent = await harness.connect("node1", memory_mb=8192)
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert start.ctx_size == 2048
    (record,) = await harness.store.replicas.list()
    assert (record.profile, record.memory_mb) == (1, 2000)
    failed = pb.ShardStatus(replica_id=start.replica_id, state=pb.SHARD_STATE_FAILED)
    await agent.send(pb.AgentMessage(status=failed))
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")
    await harness.clock.advance(120)
    await harness.reconciler.pass_once()
    again = (await receive(agent, "start")).start
    assert (again.replica_id, again.ctx_size) == (start.replica_id, 2048)
