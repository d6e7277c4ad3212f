"""A real control plane and agent export their spans over OTLP/gRPC to a real collector:
a replica's start is one trace across both processes, and a request continues its client's trace."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from llmgw.controlplane.config import save_server_config
from llmgw.observability.tracing import TracingSettings
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.otlp_collector import CollectedSpan, OtlpCollector

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
EXPORTED_S = 30.0
"""Spans leave in batches (every 5 s by default): how long to wait for them."""


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as running:
        yield running


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, collector: OtlpCollector) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("tracing")
    running = Cluster(home / "cluster", home / "cache")
    tracing = TracingSettings(enabled=True, endpoint=collector.endpoint)
    running.config.tracing = tracing
    save_server_config(running.config, running.config_path("cp1"))
    with running:
        running.start_server()
        running.add_standin_model(MODEL)
        running.create_key("tests")
        launcher = write_launcher(home / "bin" / "llama-server")
        running.add_node(
            "node1", engines={"llamacpp": {"binary": str(launcher)}}, tracing=tracing.model_dump()
        )
        running.start_agent("node1")
        running.wait_ready(MODEL, 60)
        yield running


def _one(collector: OtlpCollector, name: str, service_prefix: str) -> CollectedSpan:
    def found() -> CollectedSpan | None:
        spans = [s for s in collector.spans(name) if s.service.startswith(service_prefix)]
        return spans[0] if spans else None

    return wait_for(found, EXPORTED_S, f"span {name} from {service_prefix}")


def test_a_replicas_start_is_one_trace_across_control_plane_and_agent(
    cluster: Cluster, collector: OtlpCollector
) -> None:
    start = _one(collector, "replica.start", "llmgw-server")
    on_node = _one(collector, "shard.start", "llmgw-agent node1")
    assert on_node.trace_id == start.trace_id
    assert on_node.parent_span_id == start.span_id
    assert not start.failed and not on_node.failed
    steps = {s.name: s for s in collector.spans() if s.trace_id == start.trace_id}
    assert {"reconcile", "placement", "weights.fetch", "engine.launch", "engine.readiness"} <= set(steps)
    assert steps["weights.fetch"].parent_span_id == on_node.span_id
    assert steps["reconcile"].parent_span_id == ""  # the pass that placed it is the trace's root
    assert steps["placement"].attributes["llmgw.node"] == "node1"


def test_a_request_continues_its_clients_trace(cluster: Cluster, collector: OtlpCollector) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"traceparent": CLIENT_PARENT},
    )
    request = _one(collector, "POST /v1/chat/completions", "llmgw-server")
    assert request.trace_id == CLIENT_TRACE and request.parent_span_id == "00f067aa0ba902b7"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["llmgw.model"] == MODEL
