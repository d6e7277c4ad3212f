"""A /v1 request is a span, and the engine is sent its W3C traceparent (tracing on); off, nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.observability.tracing import Tracing
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream

from .conftest import MESSAGES, MODEL, SECRET, memory_sdk

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def gateway(
    settings: GatewaySettings, upstream: MemoryUpstream, spans: InMemorySpanExporter
) -> AsyncIterator[Gateway]:
    gw = Gateway(settings, upstream=upstream, tracing=Tracing.exporting_to(spans))
    gw.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice"))
    gw.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    yield gw
    await gw.close()


def _traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


async def test_a_request_is_a_span_whose_traceparent_the_engine_receives(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, spans: InMemorySpanExporter
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    (span,) = spans.get_finished_spans()
    assert span.name == "POST /v1/chat/completions" and span.kind is SpanKind.SERVER
    assert span.parent is None  # the client sent no trace: a new one
    assert span.attributes is not None
    assert span.attributes["llmgw.model"] == MODEL
    assert span.attributes["llmgw.replica"] == engine.replica_id
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["gen_ai.usage.output_tokens"] > 0
    context = span.get_span_context()
    assert engine.requests[0].headers["traceparent"] == _traceparent(
        context.trace_id, context.span_id, context.trace_flags
    )


async def test_a_clients_traceparent_is_continued(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, spans: InMemorySpanExporter
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers={"traceparent": CLIENT_PARENT}
    )
    (span,) = await eventually(spans.get_finished_spans, message="the request's span ended")
    assert f"{span.get_span_context().trace_id:032x}" == CLIENT_TRACE
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    sent = engine.requests[0].headers["traceparent"]
    assert sent.split("-")[1] == CLIENT_TRACE and sent != CLIENT_PARENT  # the gateway's span is the parent


async def test_a_malformed_traceparent_starts_a_new_trace(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, spans: InMemorySpanExporter
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_headers={"traceparent": "00-not-a-trace-id"}
    )
    (span,) = spans.get_finished_spans()
    assert span.parent is None
    assert (
        engine.requests[0].headers["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"
    )


async def test_a_request_no_replica_answers_is_a_failed_span(
    gateway: Gateway, client: AsyncOpenAI, spans: InMemorySpanExporter
) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the SDK's error type for a 503 is not the point
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 503


async def test_tracing_off_sends_no_traceparent_not_even_the_clients(
    engine: MemoryEngine, upstream: MemoryUpstream, settings: GatewaySettings, spans: InMemorySpanExporter
) -> None:
    gw = Gateway(settings, upstream=upstream)  # tracing off: the default
    gw.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice"))
    gw.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    gw.replicas.set_ready(engine.endpoint)
    async with memory_sdk(gw.asgi_app()) as sdk:
        await sdk.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"traceparent": CLIENT_PARENT}
        )
    await gw.close()
    assert "traceparent" not in engine.requests[0].headers
    assert spans.get_finished_spans() == ()
