"""Card telemetry over a node's stream: foreign processes replace the registration's verdict (C3.3)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.observability.gpu_metrics import GpuMetrics
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases

SHA = "c" * 64
CARD_MB = 24576


@pytest.fixture
async def cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[Store, Fleet, Reconciler, NodeSessions, CollectorRegistry]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    reconciler = Reconciler(store, fleet)
    leadership = Leadership(
        Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")
    )
    await leadership.round()
    registry = CollectorRegistry()
    sessions = NodeSessions(store, fleet, reconciler, leadership, gpu_metrics=GpuMetrics(registry))
    yield store, fleet, reconciler, sessions, registry
    await store.close()


def telemetry(foreign_mb: int) -> pb.AgentMessage:
    sample = pb.DeviceSample(
        device=0, device_class="rtx4090-24g", memory_used_mb=foreign_mb, memory_total_mb=CARD_MB
    )
    foreign = [pb.ForeignProcess(device=0, pid=4242, name="python", used_mb=foreign_mb)] if foreign_mb else []
    return pb.AgentMessage(telemetry=pb.Telemetry(samples=[sample], foreign=foreign))


async def settle(agent) -> None:  # type: ignore[no-untyped-def]
    """Send a heartbeat and wait for its answer: everything sent before it has been handled."""
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    async with asyncio.timeout(5):
        while (await agent.receive()).WhichOneof("kind") != "heartbeat":
            pass


async def test_a_card_comes_back_into_placement_when_a_foreign_process_lets_go(cluster) -> None:  # type: ignore[no-untyped-def]
    store, fleet, reconciler, sessions, registry = cluster
    await store.models.add(
        "m", {"name": "m", "source": {"sha256": SHA, "size": 100 << 20}, "profile": {"memory_mb": 20000}}
    )
    agent, control = memory_pair(agent_name="gpu1")
    task = asyncio.create_task(sessions.serve(control))
    card = pb.Device(
        kind="nvidia",
        index=0,
        name="NVIDIA GeForce RTX 4090",
        memory_mb=CARD_MB,
        memory_free_mb=2000,
        device_class="rtx4090-24g",
    )
    await agent.send(
        pb.AgentMessage(
            register=pb.Register(
                node_id="gpu1", address="127.0.0.1", cpu_cores=8, memory_mb=8192, devices=[card]
            )
        )
    )
    try:
        await agent.send(telemetry(foreign_mb=22000))
        await settle(agent)
        await reconciler.pass_once()
        assert await store.replicas.list() == []
        assert (
            registry.get_sample_value("llmgw_gpu_foreign_memory_bytes", {"node": "gpu1", "device": "0"})
            == 22000 << 20
        )

        await agent.send(telemetry(foreign_mb=0))
        await settle(agent)
        await reconciler.pass_once()
        placed = await store.replicas.list()
        assert [(r.node_id, tuple(r.devices)) for r in placed] == [("gpu1", (0,))]
        assert fleet.nodes["gpu1"].inventory.gpus[0].memory_free_mb == CARD_MB
    finally:
        task.cancel()
