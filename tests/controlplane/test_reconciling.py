"""The leader's reconciler and node sessions over an in-memory stream, with a real SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.errors import ChannelClosed, Unauthorized
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.store.replicas import ReplicaRecord
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

SHA = "a" * 64
OTHER_SHA = "b" * 64


@dataclass
class Harness:
    store: Store
    fleet: Fleet
    reconciler: Reconciler
    sessions: NodeSessions
    clock: FakeClock
    ready: dict[str, str] = field(default_factory=dict)
    kv_blocks: list[KvBlocksUpdate] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def connect(
        self,
        node_id: str,
        cert_name: str | None = None,
        memory_mb: int = 8192,
        shards: list[pb.RunningShard] | None = None,
    ):  # type: ignore[no-untyped-def]
        agent, control = memory_pair(agent_name=cert_name or node_id)
        self.tasks.append(asyncio.create_task(self.sessions.serve(control)))
        await agent.send(
            pb.AgentMessage(
                register=pb.Register(
                    node_id=node_id,
                    address="127.0.0.1",
                    cpu_cores=4,
                    memory_mb=memory_mb,
                    shards=shards or [],
                )
            )
        )
        return agent

    async def add_model(self, name: str, **fields: object) -> None:
        definition = {"name": name, "source": {"sha256": SHA, "size": 100 << 20}, **fields}
        await self.store.models.add(name, definition)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    clock = FakeClock()
    ready: dict[str, str] = {}
    fleet = Fleet(
        on_ready=lambda r, url: ready.__setitem__(r.replica_id, url),
        on_gone=lambda replica_id: ready.pop(replica_id, None),
        node_grace_s=0.05,
        clock=clock,
    )
    reconciler = Reconciler(store, fleet, backoff_s=5, clock=clock)
    leadership = Leadership(
        Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")
    )
    await leadership.round()
    kv_blocks: list[KvBlocksUpdate] = []
    sessions = NodeSessions(
        store,
        fleet,
        reconciler,
        leadership,
        on_kv_blocks=kv_blocks.append,
    )
    h = Harness(store, fleet, reconciler, sessions, clock, ready, kv_blocks)
    yield h
    for task in h.tasks:
        task.cancel()
    await asyncio.gather(*h.tasks, return_exceptions=True)  # sessions end before the store closes
    await store.close()


async def receive(agent, kind: str) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    """The next message of ``kind``, skipping others."""
    async with asyncio.timeout(5):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message


async def test_registered_node_is_told_who_leads(harness: Harness) -> None:
    agent = await harness.connect("node1")
    answer = await receive(agent, "registered")
    assert answer.registered.leader == "cp1"
    assert "127.0.0.1:8443" in answer.registered.control_planes


async def test_a_standby_points_a_registering_node_to_the_leader(harness: Harness) -> None:
    standby = Leadership(
        Leases(harness.store), Fence("cp2"), Identity("cp2", "127.0.0.1:9443", "http://127.0.0.1:9080")
    )
    await standby.round()
    sessions = NodeSessions(harness.store, harness.fleet, harness.reconciler, standby)
    agent, control = memory_pair(agent_name="node1")
    serving = asyncio.create_task(sessions.serve(control))
    await agent.send(pb.AgentMessage(register=pb.Register(node_id="node1", address="127.0.0.1")))
    answer = await receive(agent, "registered")
    await asyncio.wait_for(serving, 5)
    assert answer.registered.standby
    assert (answer.registered.leader, answer.registered.leader_address) == ("cp1", "127.0.0.1:8443")
    assert set(answer.registered.control_planes) == {"127.0.0.1:8443", "127.0.0.1:9443"}


async def test_a_control_plane_that_stops_leading_lets_its_agents_go(harness: Harness) -> None:
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.sessions._leadership.resign()
    assert harness.sessions.let_go() == 1
    await asyncio.wait_for(harness.tasks[0], 5)
    assert "node1" not in harness.fleet.nodes


async def test_registration_under_another_nodes_certificate_is_refused(harness: Harness) -> None:
    agent = await harness.connect("node1", cert_name="node2")
    await asyncio.wait_for(harness.tasks[0], 5)
    assert "node1" not in harness.fleet.nodes
    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(agent.receive(), 5)


async def test_model_with_one_replica_is_started_on_the_node(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert start.model == "m1" and start.weights_sha256 == SHA and start.api_key
    assert [r.node_id for r in await harness.store.replicas.list()] == ["node1"]


async def test_ready_shard_enters_the_gateway_table_at_its_address(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    await agent.send(
        pb.AgentMessage(
            status=pb.ShardStatus(replica_id=start.replica_id, state=pb.SHARD_STATE_READY, port=21001)
        )
    )
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")
    assert harness.ready == {start.replica_id: "http://127.0.0.1:21001"}


async def test_node_that_leaves_takes_its_replicas_out_of_the_table_after_its_grace(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    await agent.send(
        pb.AgentMessage(
            status=pb.ShardStatus(replica_id=start.replica_id, state=pb.SHARD_STATE_READY, port=21001)
        )
    )
    await agent.close()
    await asyncio.wait_for(harness.tasks[0], 5)
    assert harness.fleet.replicas[start.replica_id].state == "absent"
    assert harness.ready == {start.replica_id: "http://127.0.0.1:21001"}  # engines outlive their agent
    await eventually(lambda: not harness.ready, message="the replica leaves the router's table")


async def test_reconnected_node_without_the_shard_is_told_to_start_it_again(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    first = (await receive(agent, "start")).start
    await agent.close()
    await asyncio.wait_for(harness.tasks[0], 5)
    again = await harness.connect("node1")
    await receive(again, "registered")
    await harness.reconciler.pass_once()
    assert (await receive(again, "start")).start.replica_id == first.replica_id


async def test_removed_model_has_its_shard_stopped(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    await harness.store.models.remove("m1")
    await harness.reconciler.pass_once()
    assert (await receive(agent, "stop")).stop.replica_id == start.replica_id


async def test_shard_the_leader_does_not_know_is_stopped_on_register(harness: Harness) -> None:
    agent = await harness.connect(
        "node1", shards=[pb.RunningShard(replica_id="stray", state=pb.SHARD_STATE_READY)]
    )
    assert (await receive(agent, "stop")).stop.replica_id == "stray"


async def test_failed_replica_is_started_again_only_after_its_backoff(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    await agent.send(
        pb.AgentMessage(
            status=pb.ShardStatus(replica_id=start.replica_id, state=pb.SHARD_STATE_FAILED, error="boom")
        )
    )
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")
    await harness.reconciler.pass_once()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(receive(agent, "start"), 0.3)
    await harness.clock.advance(6)
    await harness.reconciler.pass_once()
    assert (await receive(agent, "start")).start.replica_id == start.replica_id


async def test_model_too_big_for_every_node_is_not_placed(harness: Harness) -> None:
    await harness.add_model("huge", profile={"memory_mb": 10**6})
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    assert await harness.store.replicas.list() == []


async def test_on_demand_model_starts_when_asked_and_stops_when_idle(harness: Harness) -> None:
    await harness.add_model("lazy", replicas={"min": 0, "max": 1}, on_demand=True, idle_timeout_s=60)
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    assert await harness.store.replicas.list() == []
    harness.reconciler.demand("lazy")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    await harness.clock.advance(61)
    await harness.reconciler.pass_once()
    assert (await receive(agent, "stop")).stop.replica_id == start.replica_id
    assert await harness.store.replicas.list() == []


def test_replica_state_defaults_to_placed() -> None:
    assert ReplicaState("r", "m", "n", "k").state == "placed"


async def test_connected_nodes_are_told_when_a_control_plane_joins(harness: Harness) -> None:
    box: list[NodeSessions] = []
    leader = Leadership(
        Leases(harness.store),
        Fence("cp1"),
        Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080"),
        on_planes=lambda: box[0].tell_planes(),
    )
    await leader.round()
    box.append(NodeSessions(harness.store, harness.fleet, harness.reconciler, leader))
    agent, control = memory_pair(agent_name="node1")
    harness.tasks.append(asyncio.create_task(box[0].serve(control)))
    await agent.send(pb.AgentMessage(register=pb.Register(node_id="node1", address="127.0.0.1")))
    first = await receive(agent, "registered")
    assert list(first.registered.control_planes) == ["127.0.0.1:8443"]
    await Leases(harness.store).announce("cp9", "127.0.0.1:9443", "http://127.0.0.1:9080")
    await leader.round()
    update = await receive(agent, "registered")
    assert set(update.registered.control_planes) == {"127.0.0.1:8443", "127.0.0.1:9443"}
    assert not update.registered.standby


async def test_a_new_leader_adopts_the_shards_its_nodes_report(harness: Harness) -> None:
    await harness.add_model("m")
    await harness.store.replicas.add(
        ReplicaRecord(id="m-abc123", model="m", node_id="node1", api_key="k", devices=[], memory_mb=100)
    )
    await harness.reconciler.load()  # what a control plane reads before it starts leading
    shard = pb.RunningShard(replica_id="m-abc123", model="m", state=pb.SHARD_STATE_READY, port=21000)
    agent = await harness.connect("node1", shards=[shard])
    await receive(agent, "registered")
    assert harness.fleet.replicas["m-abc123"].state == "ready"
    assert harness.ready == {"m-abc123": "http://127.0.0.1:21000"}
    await harness.reconciler.pass_once()
    with pytest.raises(TimeoutError):  # neither stopped nor started again
        async with asyncio.timeout(0.2):
            message = await agent.receive()
            raise AssertionError(f"unexpected {message.WhichOneof('kind')}")


async def test_kv_blocks_reach_the_router_only_from_the_replicas_own_node(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    other = await harness.connect("node2", memory_mb=1)
    await receive(agent, "registered")
    await receive(other, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    blocks = pb.KvBlocks(replica_id=start.replica_id, reset=True, stored=[1, 2], block_size=16)
    await other.send(pb.AgentMessage(kv_blocks=blocks))  # not node2's replica: ignored
    await agent.send(pb.AgentMessage(kv_blocks=blocks))
    for node in (other, agent):  # a heartbeat answered: what was sent before it was handled
        await node.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
        await receive(node, "heartbeat")
    assert harness.kv_blocks == [
        KvBlocksUpdate(model="m1", replica_id=start.replica_id, stored=(1, 2), reset=True, block_size=16)
    ]


def test_replica_keys_are_read_back_whole_from_an_engines_key_file(tmp_path: Path) -> None:
    """A key starting with ``#`` would be a comment in llama-server's key file; none may."""
    from llmgw.controlplane.replicas.shardspecs import replica_key
    from llmgw.core.engines import LLAMA_CPP
    from llmgw.testing.llama_server_standin import parse_args

    keys = {replica_key() for _ in range(500)}
    assert len(keys) == 500
    path = tmp_path / "api-key"
    for key in keys:
        path.write_text(LLAMA_CPP.key_input.file_text(key))
        assert parse_args(["--api-key-file", str(path)]).api_keys == [key]


async def test_a_node_may_fetch_only_the_files_of_the_replicas_placed_on_it(harness: Harness) -> None:
    await harness.add_model(
        "m1", source={"sha256": SHA, "size": 100 << 20, "projector": {"sha256": OTHER_SHA}}
    )
    agent = await harness.connect("node1")
    other = await harness.connect("node2", memory_mb=1)
    await receive(agent, "registered")
    await receive(other, "registered")
    await harness.reconciler.pass_once()
    await receive(agent, "start")

    harness.fleet.check_fetch("node1", SHA)
    harness.fleet.check_fetch("node1", OTHER_SHA)
    with pytest.raises(Unauthorized, match="node node2 runs no replica with the file aaaaaaaaaaaa"):
        harness.fleet.check_fetch("node2", SHA)
    with pytest.raises(Unauthorized, match="may not fetch it"):
        harness.fleet.check_fetch("node1", "c" * 64)


async def test_a_new_leader_lets_nodes_fetch_the_files_of_replicas_placed_before(harness: Harness) -> None:
    await harness.add_model("m")
    await harness.store.replicas.add(
        ReplicaRecord(id="m-abc123", model="m", node_id="node1", api_key="k", devices=[], memory_mb=100)
    )
    with pytest.raises(Unauthorized):
        harness.fleet.check_fetch("node1", SHA)

    await harness.reconciler.load()  # what a control plane reads before it starts leading

    harness.fleet.check_fetch("node1", SHA)  # a fetch under way at the failover goes on


async def test_a_removed_replica_takes_its_nodes_fetch_rights_with_it(harness: Harness) -> None:
    await harness.add_model("m1")
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    await receive(agent, "start")
    await harness.store.models.remove("m1")

    await harness.reconciler.pass_once()

    with pytest.raises(Unauthorized):
        harness.fleet.check_fetch("node1", SHA)


async def test_a_shard_start_carries_the_models_adapters_and_their_largest_rank(harness: Harness) -> None:
    config = {"sha256": OTHER_SHA, "filename": "adapter_config.json", "size": 30}
    await harness.add_model(
        "m1",
        source={"sha256": SHA, "format": "safetensors", "size": 100 << 20},
        profile={"engine": "vllm", "max_loaded_adapters": 1},
        adapters=[
            {"name": "sql", "sha256": OTHER_SHA, "size": 10, "files": [config], "rank": 8},
            {"name": "chat", "sha256": OTHER_SHA, "filename": "w.safetensors", "files": [config], "rank": 32},
        ],
    )
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert [(a.name, a.filename, a.size) for a in start.adapters] == [
        ("sql", "adapter_model.safetensors", 10), ("chat", "w.safetensors", 0)
    ]  # fmt: skip
    assert [f.filename for f in start.adapters[0].files] == ["adapter_config.json"]
    assert not start.adapters[0].HasField("scale")
    assert (start.max_loaded_adapters, start.max_lora_rank) == (1, 32)


async def test_the_adapter_paths_a_ready_shard_reports_reach_its_replica(harness: Harness) -> None:
    await harness.add_model("m1", adapters=[{"name": "tone", "sha256": OTHER_SHA, "scale": 0.5}])
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert start.adapters[0].scale == 0.5 and start.adapters[0].filename == "adapter.gguf"
    status = pb.ShardStatus(
        replica_id=start.replica_id,
        state=pb.SHARD_STATE_READY,
        port=21001,
        adapter_paths={"tone": "/w/t.gguf"},
    )
    await agent.send(pb.AgentMessage(status=status))
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")
    assert harness.fleet.replicas[start.replica_id].adapter_paths == {"tone": "/w/t.gguf"}


async def _ready_on(harness: Harness, node_id: str, others: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """One replica of m1 ready on ``node_id`` (``others`` connected after): its stream, start, others'."""
    await harness.add_model("m1")
    agent = await harness.connect(node_id)
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    status = pb.ShardStatus(replica_id=start.replica_id, state=pb.SHARD_STATE_READY, port=21001)
    await agent.send(pb.AgentMessage(status=status))
    await eventually(lambda: start.replica_id in harness.ready, message="the replica is ready")
    streams = []
    for other in others:
        streams.append(await harness.connect(other))
        await receive(streams[-1], "registered")
    return agent, start, streams


async def _leave(harness: Harness, agent, index: int = 0) -> None:  # type: ignore[no-untyped-def]
    await agent.close()
    await asyncio.wait_for(harness.tasks[index], 5)


async def test_a_replica_of_a_node_gone_past_its_grace_is_placed_on_another_node(harness: Harness) -> None:
    harness.fleet.node_grace_s = 15
    agent, first, (other,) = await _ready_on(harness, "node1", others=("node2",))
    await _leave(harness, agent)
    await harness.clock.advance(14.9)
    await harness.reconciler.pass_once()
    with pytest.raises(TimeoutError):  # within the grace: the node may be an agent restarting
        await asyncio.wait_for(receive(other, "start"), 0.2)
    assert harness.fleet.next_loss_s() == pytest.approx(0.1)

    await harness.clock.advance(0.1)
    await harness.reconciler.pass_once()

    moved = (await receive(other, "start")).start
    assert moved.model == "m1" and moved.replica_id != first.replica_id
    assert moved.api_key != first.api_key
    assert [(r.id, r.node_id) for r in await harness.store.replicas.list()] == [(moved.replica_id, "node2")]
    assert first.replica_id not in harness.fleet.replicas
    assert first.replica_id not in harness.ready, "the lost node's replica is no longer routed"
    assert harness.fleet.next_loss_s() is None


async def test_a_lost_node_that_comes_back_is_told_to_stop_its_stray(harness: Harness) -> None:
    harness.fleet.node_grace_s = 15
    agent, first, (other,) = await _ready_on(harness, "node1", others=("node2",))
    await _leave(harness, agent)
    await harness.clock.advance(16)
    await harness.reconciler.pass_once()
    moved = (await receive(other, "start")).start

    stray = pb.RunningShard(replica_id=first.replica_id, model="m1", state=pb.SHARD_STATE_READY, port=21001)
    back = await harness.connect("node1", shards=[stray])

    stop = (await receive(back, "stop")).stop
    assert stop.replica_id == first.replica_id
    assert "moved to another node" in stop.reason
    assert first.replica_id not in harness.fleet.replicas and first.replica_id not in harness.ready
    await harness.reconciler.pass_once()
    assert [(r.id, r.node_id) for r in await harness.store.replicas.list()] == [(moved.replica_id, "node2")]


async def test_a_replica_no_other_node_can_take_waits_for_its_node(harness: Harness) -> None:
    harness.fleet.node_grace_s = 15
    agent, first, _ = await _ready_on(harness, "node1")
    small = await harness.connect("node2", memory_mb=1)
    await receive(small, "registered")
    await _leave(harness, agent)
    await harness.clock.advance(60)
    await harness.reconciler.pass_once()
    assert [r.id for r in await harness.store.replicas.list()] == [first.replica_id]

    running = pb.RunningShard(replica_id=first.replica_id, model="m1", state=pb.SHARD_STATE_READY, port=21001)
    back = await harness.connect("node1", shards=[running])
    await receive(back, "registered")

    assert harness.fleet.replicas[first.replica_id].state == "ready"
    assert harness.ready == {first.replica_id: "http://127.0.0.1:21001"}


async def test_a_new_leader_moves_the_replicas_of_a_node_that_never_registers(harness: Harness) -> None:
    harness.fleet.node_grace_s = 15
    await harness.add_model("m")
    await harness.store.replicas.add(
        ReplicaRecord(id="m-abc123", model="m", node_id="node1", api_key="k", devices=[], memory_mb=100)
    )
    await harness.reconciler.load()  # the node's grace starts when this leader learns of its replica
    other = await harness.connect("node2")
    await receive(other, "registered")
    await harness.clock.advance(10)
    await harness.reconciler.pass_once()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(receive(other, "start"), 0.2)

    await harness.clock.advance(5)
    await harness.reconciler.pass_once()

    assert (await receive(other, "start")).start.model == "m"
    assert [r.node_id for r in await harness.store.replicas.list()] == ["node2"]


async def test_a_control_plane_that_leads_again_gives_away_nodes_their_grace_anew(harness: Harness) -> None:
    harness.fleet.node_grace_s = 15
    agent, first, (other,) = await _ready_on(harness, "node1", others=("node2",))
    await _leave(harness, agent)
    await harness.clock.advance(100)  # away while another control plane led, say: no pass ran here
    running = asyncio.create_task(harness.reconciler.run())
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(receive(other, "start"), 0.3)
        await harness.clock.advance(15)
        harness.reconciler.wake()
        assert (await receive(other, "start")).start.replica_id != first.replica_id
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_pass_places_at_most_its_share_and_the_loop_places_the_rest_at_once(tmp_path: Path) -> None:
    """Five replicas wanted, two placements a pass: three passes, run back to back by the loop
    (whose interval is a minute), each writing what it placed."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'budget.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    reconciler = Reconciler(store, fleet, interval_s=60, placements_per_pass=2)
    leadership = Leadership(Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://x"))
    await leadership.round()
    sessions = NodeSessions(store, fleet, reconciler, leadership)
    agent, control = memory_pair(agent_name="node1")
    serving = asyncio.create_task(sessions.serve(control))
    looping: asyncio.Task[None] | None = None
    try:
        await agent.send(
            pb.AgentMessage(register=pb.Register(node_id="node1", address="127.0.0.1", memory_mb=65536))
        )
        await receive(agent, "registered")
        await store.models.add("m1", {"name": "m1", "source": {"sha256": SHA, "size": 100 << 20},
                                      "replicas": {"min": 5, "max": 5}})  # fmt: skip
        await reconciler.pass_once()
        assert len(await store.replicas.list()) == 2 and reconciler.more_to_place
        assert "m1" not in reconciler.unplaced  # not refused: its turn is the next pass
        looping = asyncio.create_task(reconciler.run())

        async def all_placed() -> bool:
            return len(await store.replicas.list()) == 5 and not reconciler.more_to_place

        await eventually(all_placed, timeout_s=10, message="the loop placed the rest without its interval")
        starts = [(await receive(agent, "start")).start.replica_id for _ in range(5)]
        assert sorted(starts) == sorted(r.id for r in await store.replicas.list())
    finally:
        for task in (looping, serving):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (looping, serving) if t is not None), return_exceptions=True)
        await store.close()
