"""A shard's start on the agent continues the control plane's trace: install, fetch, launch, readiness."""

from __future__ import annotations

import dataclasses
import hashlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from llmgw.agent.config import AgentConfig
from llmgw.agent.installing import BlobFetcher, Installer
from llmgw.agent.starttracing import ShardStartTraces
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.devices import NodeInventory
from llmgw.core.engines import LLAMA_CPP
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.observability.tracing import TRACING_OFF, Tracing, traceparent
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

from .test_shard_supervising import SETTINGS, AnsweringLauncher, FakeLauncher

WEIGHTS = b"gguf weights " * 64
SHA = hashlib.sha256(WEIGHTS).hexdigest()


async def _fetch(digest: str, offset: int) -> AsyncIterator[bytes]:
    yield WEIGHTS[offset:]  # whatever was asked: a file of another sha256 fails its check


def _fetcher() -> BlobFetcher:
    return _fetch


@dataclass
class Node:
    supervisor: ShardSupervisor
    launcher: FakeLauncher
    spans: InMemorySpanExporter
    tracing: Tracing
    statuses: list[ShardStatus]

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]


async def _node(
    tmp_path: Path, launcher: FakeLauncher, tracing: Tracing, spans: InMemorySpanExporter
) -> Node:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config = AgentConfig(
        node_id="n1",
        control_planes=["127.0.0.1:1"],
        work_dir=str(tmp_path / "work"),
        engines={"llamacpp": {"binary": str(binary)}},
    )
    traces = ShardStartTraces(tracing)
    installer = Installer(config, lambda: NodeInventory(node_id="n1"), _fetcher, traces)
    supervisor = ShardSupervisor(
        tmp_path / "work",
        SETTINGS,
        installer.prepare,
        launcher=traces.launcher(launcher),
        clock=launcher.clock,
    )
    supervisor.traced = traces.emitted
    statuses: list[ShardStatus] = []
    supervisor.report = statuses.append
    return Node(supervisor, launcher, spans, tracing, statuses)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    spans = InMemorySpanExporter()
    launcher = AnsweringLauncher(FakeClock(), ends_on=(signal.SIGTERM,))
    n = await _node(tmp_path, launcher, Tracing.exporting_to(spans), spans)
    yield n
    for engine in launcher.engines:
        if engine.returncode is None:
            engine.end(0)
    await n.supervisor.stop_all()
    for engine in launcher.engines:
        await engine.runner.cleanup()  # type: ignore[attr-defined]


def _spec(parent: str) -> ShardSpec:
    return ShardSpec(
        replica_id="r1",
        model="m",
        engine=LLAMA_CPP.name,
        api_key="sk-replica",
        weights_sha256=SHA,
        weights_size=len(WEIGHTS),
        traceparent=parent,
    )


async def test_the_start_continues_the_control_planes_span_until_ready(node: Node) -> None:
    control_plane = node.tracing.span("replica.start")  # what StartShard's traceparent names
    node.supervisor.start(_spec(traceparent(control_plane)))
    await eventually(lambda: ShardState.READY in [s.state for s in node.statuses], message="ready")
    (start,) = node.named("shard.start")
    trace_id = control_plane.get_span_context().trace_id
    assert start.context.trace_id == trace_id
    assert start.parent is not None and start.parent.span_id == control_plane.get_span_context().span_id
    assert start.status.status_code is not StatusCode.ERROR
    steps = {s.name: s for s in node.spans.get_finished_spans() if s is not start and s.name != "shard.start"}
    assert set(steps) == {"engine.install", "weights.fetch", "engine.launch", "engine.readiness"}
    for step in steps.values():
        assert step.parent is not None and step.parent.span_id == start.context.span_id
    assert (
        steps["weights.fetch"].attributes is not None
        and steps["weights.fetch"].attributes["llmgw.sha256"] == SHA
    )
    launched = steps["engine.launch"].end_time
    assert launched is not None and steps["engine.readiness"].start_time is not None
    assert steps["engine.readiness"].start_time >= launched


async def test_a_start_that_fails_ends_its_span_failed_with_the_reason(tmp_path: Path) -> None:
    spans = InMemorySpanExporter()
    tracing = Tracing.exporting_to(spans)
    node = await _node(tmp_path, FakeLauncher(FakeClock(), crash=True), tracing, spans)
    spec = _spec(traceparent(tracing.span("replica.start")))
    node.supervisor.start(dataclasses.replace(spec, weights_sha256="b" * 64))  # the file will not match
    await eventually(lambda: ShardState.FAILED in [s.state for s in node.statuses], message="failed")
    (start,) = node.named("shard.start")
    assert start.status.status_code is StatusCode.ERROR
    assert start.status.description is not None and "b" * 12 in start.status.description
    (fetch,) = node.named("weights.fetch")
    assert fetch.status.status_code is StatusCode.ERROR
    await node.supervisor.stop_all()


async def test_a_spec_without_traceparent_makes_no_span(node: Node) -> None:
    node.supervisor.start(_spec(""))
    await eventually(lambda: ShardState.READY in [s.state for s in node.statuses], message="ready")
    assert node.spans.get_finished_spans() == ()


def test_tracing_off_makes_nothing_even_with_a_traceparent() -> None:
    traces = ShardStartTraces(TRACING_OFF)
    launcher = FakeLauncher(FakeClock())
    assert traces.launcher(launcher) is launcher  # no wrapper: a launch costs nothing more
    traces.emitted(_spec("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), ShardState.STARTING)
    with traces.step("r1", "weights.fetch") as span:
        assert span is None


def test_a_start_is_traced_once_per_traceparent_not_again_on_an_engine_restart() -> None:
    spans = InMemorySpanExporter()
    tracing = Tracing.exporting_to(spans)
    traces = ShardStartTraces(tracing)
    spec = _spec(traceparent(tracing.span("replica.start")))
    traces.emitted(spec, ShardState.STARTING)
    traces.emitted(spec, ShardState.READY)
    traces.emitted(spec, ShardState.STARTING, "engine exited with code 1")  # crashed, restarting
    with traces.step("r1", "weights.fetch") as span:
        assert span is None
    traces.emitted(spec, ShardState.READY)
    assert [s.name for s in spans.get_finished_spans()] == ["shard.start"]
