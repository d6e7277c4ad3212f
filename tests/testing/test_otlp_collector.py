"""The test kit's OTLP/gRPC collector records what a real OTLP exporter sends it."""

from __future__ import annotations

from llmgw.observability.tracing import Tracing, TracingSettings, failed
from llmgw.testing.otlp_collector import OtlpCollector


def test_the_collector_records_the_spans_an_exporter_sends() -> None:
    with OtlpCollector() as collector:
        tracing = Tracing.from_settings(TracingSettings(enabled=True, endpoint=collector.endpoint), "probe")
        parent = tracing.span("parent", attributes={"k": "v", "many": ["a", "b"]})
        child = tracing.span("child", parent)
        failed(child, "boom")
        child.end()
        parent.end()
        tracing.shutdown()  # exports what is left before it returns
        (first, second) = collector.spans()
    assert (first.name, second.name) == ("child", "parent")
    assert first.service == second.service == "probe"
    assert first.trace_id == second.trace_id and len(first.trace_id) == 32
    assert first.parent_span_id == second.span_id and second.parent_span_id == ""
    assert first.failed and not second.failed
    assert second.attributes == {"k": "v", "many": ["a", "b"]}
