"""A node's stream and releases: the mirror's builds told, its version kept, its refusals heard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.mirrorbuilds import BuildAsset, MirroredBuild
from llmgw.core.upgrades import UpgradeResult
from llmgw.mirror.builds import BuildIndex
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.eventually import eventually

SHA = "d" * 64


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[tuple[Fleet, NodeSessions]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    leadership = Leadership(
        Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")
    )
    await leadership.round()
    yield fleet, NodeSessions(store, fleet, Reconciler(store, fleet), leadership)
    await store.close()


async def receive_kind(agent, kind: str) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message  # type: ignore[no-any-return]


async def test_a_registering_node_is_told_the_mirror_s_builds(
    sessions: tuple[Fleet, NodeSessions], tmp_path: Path
) -> None:
    fleet, node_sessions = sessions
    index = BuildIndex(tmp_path / "mirror")
    index.add(MirroredBuild("llama.cpp", "b1", "cpu", "x64", (BuildAsset("a.tar.gz", SHA, 10),)))
    node_sessions.mirror_builds = index.message
    results: list[tuple[str, UpgradeResult]] = []
    node_sessions.on_upgrade_result = lambda node_id, result: results.append((node_id, result))
    agent, control = memory_pair(agent_name="n1")
    task = asyncio.create_task(node_sessions.serve(control))
    register = pb.Register(
        node_id="n1", address="127.0.0.1", cpu_cores=2, memory_mb=4096, agent_version="1.0.0"
    )
    await agent.send(pb.AgentMessage(register=register))
    told = await receive_kind(agent, "builds")
    assert [(b.variant, [a.sha256 for a in b.assets]) for b in told.builds.builds] == [("cpu", [SHA])]
    assert fleet.nodes["n1"].agent_version == "1.0.0"
    await agent.send(pb.AgentMessage(upgrade_result=pb.UpgradeResult(version="2.0.0", error="not signed")))
    await eventually(lambda: results == [("n1", UpgradeResult("2.0.0", "not signed"))])
    task.cancel()


async def test_no_builds_no_message(sessions: tuple[Fleet, NodeSessions]) -> None:
    _fleet, node_sessions = sessions
    agent, control = memory_pair(agent_name="n1")
    task = asyncio.create_task(node_sessions.serve(control))
    await agent.send(pb.AgentMessage(register=pb.Register(node_id="n1", address="127.0.0.1", cpu_cores=2)))
    await receive_kind(agent, "registered")
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    answer = await agent.receive()
    assert answer.WhichOneof("kind") == "heartbeat"  # nothing about builds came before it
    task.cancel()
