"""A new leader carries on what the last one was in the middle of: replicas draining, adapter rolls.

Two leaders, one after the other, on the same SQLite store (each its own
connection, fleet, reconciler and node sessions), over in-memory streams; the
store's clock and the reconcilers' are the same fake clock, so a drain's
timeout can be shown to count from when the drain began.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.scaling import ModelLoad
from llmgw.errors import NotLeader
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.clock import FakeClock

SHA = "a" * 64
TONE_SHA = "b" * 64
SCALING = {"min": 1, "max": 2, "scale_up_cooldown_s": 0, "scale_down_cooldown_s": 0, "drain_timeout_s": 30}
MODEL: dict[str, Any] = {"name": "m", "source": {"sha256": SHA, "size": 100 << 20}}
WITH_TONE: dict[str, Any] = {**MODEL, "adapters": [{"name": "tone", "sha256": TONE_SHA}]}


@dataclass
class Leader:
    """One control plane leading: its store connection, fleet, reconciler and the gateway it tells."""

    name: str
    store: Store
    fleet: Fleet
    reconciler: Reconciler
    sessions: NodeSessions
    leadership: Leadership
    loads: dict[str, ModelLoad] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    ready: dict[str, str] = field(default_factory=dict)
    drained: list[str] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def connect(self, node_id: str, shards: list[pb.RunningShard] | None = None, memory_mb: int = 8192):  # type: ignore[no-untyped-def]
        agent, control = memory_pair(agent_name=node_id)
        self.tasks.append(asyncio.create_task(self.sessions.serve(control)))
        register = pb.Register(
            node_id=node_id, address="127.0.0.1", cpu_cores=4, memory_mb=memory_mb, shards=shards or []
        )
        await agent.send(pb.AgentMessage(register=register))
        await receive(agent, "registered")
        return agent

    async def ready_with(
        self, agent, replica_id: str, port: int, paths: dict[str, str] | None = None
    ) -> None:  # type: ignore[no-untyped-def]
        status = pb.ShardStatus(
            replica_id=replica_id, state=pb.SHARD_STATE_READY, port=port, adapter_paths=paths or {}
        )
        await agent.send(pb.AgentMessage(status=status))
        await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
        await receive(agent, "heartbeat")

    async def die(self) -> None:
        """Its streams end and it gives the lease up (as a leader killed would, once its lease lapsed)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.leadership.resign()
        await self.store.close()


@dataclass
class Planes:
    url: str
    clock: FakeClock
    leaders: list[Leader] = field(default_factory=list)

    async def lead(self, name: str) -> Leader:
        """A control plane that takes the lease and what the last leader had under way."""
        store = await Store.open(self.url, clock=self.clock)
        ready: dict[str, str] = {}
        fleet = Fleet(
            on_ready=lambda r, url: ready.__setitem__(r.replica_id, url),
            on_gone=lambda replica_id: ready.pop(replica_id, None),
            clock=self.clock,
        )
        drained: list[str] = []

        def drain(replica_id: str) -> None:
            drained.append(replica_id)
            ready.pop(replica_id, None)

        loads: dict[str, ModelLoad] = {}
        in_flight: dict[str, int] = {}
        reconciler = Reconciler(
            store,
            fleet,
            clock=self.clock,
            load=lambda model: loads.get(model, ModelLoad()),
            drain=drain,
            replica_in_flight=lambda replica_id: in_flight.get(replica_id, 0),
        )
        fence = Fence(name)
        leadership = Leadership(
            Leases(store),
            fence,
            Identity(name, "127.0.0.1:8443", "http://x"),
            before_leading=reconciler.take_over,
        )
        store.fence = fence
        await leadership.round()
        assert leadership.leading
        sessions = NodeSessions(store, fleet, reconciler, leadership)
        leader = Leader(
            name, store, fleet, reconciler, sessions, leadership, loads, in_flight, ready, drained
        )
        self.leaders.append(leader)
        return leader


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[Planes]:
    planes = Planes(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}", FakeClock())
    yield planes
    for leader in planes.leaders:
        for task in leader.tasks:
            task.cancel()
        await asyncio.gather(*leader.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await leader.store.close()


async def receive(agent, kind: str) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message


async def quiet(agent, kind: str) -> None:  # type: ignore[no-untyped-def]
    """No message of ``kind`` comes for a moment."""
    with pytest.raises(TimeoutError):
        await receive_within(agent, kind, 0.2)


async def receive_within(agent, kind: str, timeout_s: float) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout_s):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message


def running(replica_id: str, port: int, paths: dict[str, str] | None = None) -> pb.RunningShard:
    return pb.RunningShard(
        replica_id=replica_id, model="m", state=pb.SHARD_STATE_READY, port=port, adapter_paths=paths or {}
    )


async def two_replicas_one_draining(leader: Leader) -> tuple[str, str]:
    """Scale ``m`` up to two ready replicas, then down: one drains with a request still on it."""
    await leader.store.models.add("m", {**MODEL, "replicas": SCALING})
    agent = await leader.connect("node1")
    await leader.reconciler.pass_once()
    first = (await receive(agent, "start")).start.replica_id
    await leader.ready_with(agent, first, 21001)
    leader.loads["m"] = ModelLoad(ready=1, slots=4, running=4, waiting=2)
    await leader.reconciler.pass_once()
    second = (await receive(agent, "start")).start.replica_id
    await leader.ready_with(agent, second, 21002)
    leader.loads["m"] = ModelLoad(ready=2, slots=8, running=0)
    leader.in_flight.update({first: 1, second: 1})
    await leader.reconciler.pass_once()
    (victim,) = leader.drained
    kept = ({first, second} - {victim}).pop()
    return victim, kept


async def test_a_replica_draining_drains_on_at_the_new_leader_and_is_never_routed_to(planes: Planes) -> None:
    cp1 = await planes.lead("cp1")
    victim, kept = await two_replicas_one_draining(cp1)
    await cp1.die()

    cp2 = await planes.lead("cp2")
    assert cp2.fleet.replicas[victim].draining_since is not None
    assert cp2.fleet.replicas[victim].drain_reason.startswith("scaled down")
    assert cp2.drained == [victim]  # its gateway was told before any agent came back
    agent = await cp2.connect("node1", shards=[running(victim, 21001), running(kept, 21002)])
    assert cp2.ready == {kept: "http://127.0.0.1:21002"}  # reported ready, the draining one is not routed to
    cp2.in_flight[victim] = 1
    await cp2.reconciler.pass_once()
    await quiet(agent, "stop")  # its request is still on it
    assert {r.id for r in await cp2.store.replicas.list()} == {victim, kept}
    assert cp2.drained == [victim]  # nothing else drained: the count is the one it scaled down to
    cp2.in_flight[victim] = 0
    await cp2.reconciler.pass_once()
    stop = (await receive(agent, "stop")).stop
    assert (stop.replica_id, stop.reason.startswith("scaled down"), stop.reason.endswith("(drained)")) == (
        victim,
        True,
        True,
    )
    assert [r.id for r in await cp2.store.replicas.list()] == [kept]
    assert await cp2.store.leader_state.drains() == []


async def test_a_drain_s_timeout_counts_from_when_it_began_not_from_the_failover(planes: Planes) -> None:
    cp1 = await planes.lead("cp1")
    victim, kept = await two_replicas_one_draining(cp1)
    await planes.clock.advance(20)
    await cp1.die()

    cp2 = await planes.lead("cp2")
    agent = await cp2.connect("node1", shards=[running(victim, 21001), running(kept, 21002)])
    cp2.in_flight[victim] = 3
    await planes.clock.advance(9)
    await cp2.reconciler.pass_once()
    await quiet(agent, "stop")  # 29 s into its 30
    await planes.clock.advance(1)
    await cp2.reconciler.pass_once()
    stop = (await receive(agent, "stop")).stop
    assert (stop.replica_id, stop.reason.endswith("(3 request(s) still on it after 30 s)")) == (victim, True)


async def test_a_leader_that_lost_the_lease_records_no_drain(planes: Planes) -> None:
    cp1 = await planes.lead("cp1")
    await cp1.store.models.add("m", {**MODEL, "replicas": SCALING})
    agent = await cp1.connect("node1")
    await cp1.reconciler.pass_once()
    first = (await receive(agent, "start")).start.replica_id
    await cp1.ready_with(agent, first, 21001)
    cp1.store.fence.epoch = None  # type: ignore[union-attr]  # deposed: its writes are refused
    cp1.reconciler.drain(cp1.fleet.replicas[first], "scaled down")
    with pytest.raises(NotLeader):
        await cp1.reconciler.pass_once()
    cp1.store.fence = None
    assert await cp1.store.leader_state.drains() == []


@pytest.mark.parametrize(
    "replicas", [{"min": 1, "max": 1}, {"min": 1, "max": 3}], ids=["fixed", "autoscaled"]
)
async def test_a_roll_half_done_goes_on_at_the_new_leader_with_the_same_surge(
    planes: Planes, replicas: dict[str, int]
) -> None:
    cp1 = await planes.lead("cp1")
    await cp1.store.models.add("m", {**MODEL, "replicas": replicas})
    agent = await cp1.connect("node1")
    await cp1.reconciler.pass_once()
    first = (await receive(agent, "start")).start.replica_id
    await cp1.ready_with(agent, first, 21001, {})
    await cp1.reconciler.pass_once()
    await cp1.store.models.put("m", {**WITH_TONE, "replicas": replicas})  # the adapter added: a roll
    await cp1.reconciler.pass_once()
    surge = (await receive(agent, "start")).start.replica_id
    await cp1.die()  # the surge placed and starting, the old replica not drained yet

    cp2 = await planes.lead("cp2")
    assert await cp2.store.leader_state.surges() == {"m": surge}
    await cp2.reconciler.pass_once()  # before the agent is back: which replica is old is not known yet
    assert cp2.drained == [] and len(await cp2.store.replicas.list()) == 2
    back = await cp2.connect(
        "node1", shards=[running(first, 21001, {}), running(surge, 21002, {"tone": "/w/tone.gguf"})]
    )
    await cp2.reconciler.pass_once()
    assert cp2.drained == [first]  # the old one, in the surge's place
    stop = (await receive(back, "stop")).stop
    assert stop.replica_id == first and stop.reason.startswith("started without adapter(s) tone")
    await cp2.reconciler.pass_once()
    await quiet(back, "start")  # the roll did not start over: no third replica
    assert [r.id for r in await cp2.store.replicas.list()] == [surge]
    assert await cp2.store.leader_state.surges() == {}


async def test_a_roll_whose_surge_is_not_yet_ready_waits_for_it_at_the_new_leader(planes: Planes) -> None:
    cp1 = await planes.lead("cp1")
    await cp1.store.models.add("m", {**MODEL, "replicas": {"min": 1, "max": 1}})
    agent = await cp1.connect("node1")
    await cp1.reconciler.pass_once()
    first = (await receive(agent, "start")).start.replica_id
    await cp1.ready_with(agent, first, 21001, {})
    await cp1.store.models.put("m", {**WITH_TONE, "replicas": {"min": 1, "max": 1}})
    await cp1.reconciler.pass_once()
    surge = (await receive(agent, "start")).start.replica_id
    await cp1.die()

    cp2 = await planes.lead("cp2")
    back = await cp2.connect("node1", shards=[running(first, 21001, {})])  # the surge's engine never started
    await cp2.reconciler.pass_once()
    again = (await receive(back, "start")).start
    assert again.replica_id == surge and [a.name for a in again.adapters] == ["tone"]  # sent again
    assert cp2.drained == []  # the old one serves until the surge does
    await cp2.ready_with(back, surge, 21002, {"tone": "/w/tone.gguf"})
    await cp2.reconciler.pass_once()
    assert cp2.drained == [first]
    assert [r.id for r in await cp2.store.replicas.list()] == [surge]
