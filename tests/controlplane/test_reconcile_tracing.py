"""Reconcile passes as traces and replica starts as spans, over an in-memory stream (tracing on)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.observability.tracing import Tracing
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.clock import FakeClock

SHA = "a" * 64


@dataclass
class Traced:
    store: Store
    reconciler: Reconciler
    sessions: NodeSessions
    spans: InMemorySpanExporter
    tasks: list[asyncio.Task[None]]
    clock: FakeClock

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

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]


async def receive(agent, kind: str) -> pb.ControlMessage:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(5):
        while True:
            message = await agent.receive()
            if message.WhichOneof("kind") == kind:
                return message


async def report(agent, replica_id: str, state: int, error: str = "") -> None:  # type: ignore[no-untyped-def]
    """Send a shard's state and wait until the control plane has handled it (a heartbeat round trip)."""
    await agent.send(
        pb.AgentMessage(status=pb.ShardStatus(replica_id=replica_id, state=state, port=21001, error=error))
    )
    await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    await receive(agent, "heartbeat")


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[Traced]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    clock = FakeClock()
    spans = InMemorySpanExporter()
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None, clock=clock)
    reconciler = Reconciler(store, fleet, backoff_s=5, clock=clock, tracing=Tracing.exporting_to(spans))
    leadership = Leadership(
        Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")
    )
    await leadership.round()
    h = Traced(store, reconciler, NodeSessions(store, fleet, reconciler, leadership), spans, [], clock)
    yield h
    for task in h.tasks:
        task.cancel()
    await asyncio.gather(*h.tasks, return_exceptions=True)  # sessions end before the store closes
    await store.close()


async def test_a_pass_that_places_a_replica_is_a_trace_with_every_nodes_reason(traced: Traced) -> None:
    await traced.add_model("m1", profile={"memory_mb": 4096})
    await traced.connect("big")
    await traced.connect("small", memory_mb=1024)
    await traced.reconciler.pass_once()
    (root,) = traced.named("reconcile")
    (placement,) = traced.named("placement")
    assert root.parent is None
    assert placement.parent is not None and placement.parent.span_id == root.context.span_id
    assert placement.attributes is not None
    assert placement.attributes["llmgw.node"] == "big"
    (refusal,) = placement.attributes["llmgw.refusals"]  # type: ignore[misc]
    assert refusal.startswith("small: needs")
    (scale,) = traced.named("scale")
    assert scale.attributes is not None and (
        scale.attributes["llmgw.from"],
        scale.attributes["llmgw.to"],
    ) == (0, 1)


async def test_a_pass_that_changes_nothing_leaves_no_trace(traced: Traced) -> None:
    await traced.add_model("m1")
    await traced.connect("node1")
    await traced.reconciler.pass_once()
    before = len(traced.spans.get_finished_spans())
    await traced.reconciler.pass_once()
    assert len(traced.spans.get_finished_spans()) == before


async def test_a_model_no_node_can_take_is_a_failed_placement_naming_each_node(traced: Traced) -> None:
    await traced.add_model("huge", profile={"memory_mb": 10**6})
    await traced.connect("node1")
    await traced.reconciler.pass_once()
    (placement,) = traced.named("placement")
    assert placement.status.status_code is StatusCode.ERROR
    assert placement.attributes is not None
    assert [r.split(":")[0] for r in placement.attributes["llmgw.refusals"]] == ["node1"]  # type: ignore[union-attr]
    await traced.reconciler.pass_once()  # the same reasons again: no new trace, as no new log line
    assert len(traced.named("placement")) == 1


async def test_a_replica_start_is_a_span_until_its_node_reports_it_ready(traced: Traced) -> None:
    await traced.add_model("m1")
    agent = await traced.connect("node1")
    await traced.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert traced.named("replica.start") == []  # open while the node starts it
    await report(agent, start.replica_id, pb.SHARD_STATE_STARTING)
    assert traced.named("replica.start") == []
    await report(agent, start.replica_id, pb.SHARD_STATE_READY)
    (span,) = traced.named("replica.start")
    context = span.get_span_context()
    assert start.traceparent == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert span.status.status_code is not StatusCode.ERROR
    (root,) = traced.named("reconcile")
    assert span.parent is not None and span.parent.span_id == root.context.span_id


async def test_a_failed_replica_ends_its_start_and_its_restart_is_a_new_span(traced: Traced) -> None:
    await traced.add_model("m1")
    agent = await traced.connect("node1")
    await traced.reconciler.pass_once()
    first = (await receive(agent, "start")).start
    await report(agent, first.replica_id, pb.SHARD_STATE_FAILED, "boom")
    (failed,) = traced.named("replica.start")
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "boom"
    await traced.clock.advance(6)
    await traced.reconciler.pass_once()
    again = (await receive(agent, "start")).start
    assert again.traceparent and again.traceparent != first.traceparent
    assert len(traced.named("replica.restart")) == 1


async def test_a_replica_stopped_is_a_stop_span_with_its_reason(traced: Traced) -> None:
    await traced.add_model("m1")
    agent = await traced.connect("node1")
    await traced.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    await traced.store.models.remove("m1")
    await traced.reconciler.pass_once()
    (stop,) = traced.named("replica.stop")
    assert stop.attributes is not None and stop.attributes["llmgw.replica"] == start.replica_id
    (unfinished,) = traced.named("replica.start")  # it never served: its start ends, failed
    assert unfinished.status.status_code is StatusCode.ERROR


async def test_tracing_off_sends_no_traceparent(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    reconciler = Reconciler(store, fleet)
    leadership = Leadership(
        Leases(store), Fence("cp1"), Identity("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")
    )
    await leadership.round()
    h = Traced(
        store,
        reconciler,
        NodeSessions(store, fleet, reconciler, leadership),
        InMemorySpanExporter(),
        [],
        FakeClock(),
    )
    await h.add_model("m1")
    agent = await h.connect("node1")
    await reconciler.pass_once()
    assert (await receive(agent, "start")).start.traceparent == ""
    for task in h.tasks:
        task.cancel()
    await asyncio.gather(*h.tasks, return_exceptions=True)  # sessions end before the store closes
    await store.close()
