"""Tracing's settings, its off switch and W3C trace context."""

from __future__ import annotations

import pydantic
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmgw.observability.tracing import TRACING_OFF, Tracing, TracingSettings, context_of, traceparent

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_tracing_is_off_unless_enabled() -> None:
    assert TracingSettings().enabled is False
    assert Tracing.from_settings(TracingSettings(), "llmgw-server") is TRACING_OFF
    assert TRACING_OFF.enabled is False


def test_enabled_tracing_exports_to_the_endpoint() -> None:
    tracing = Tracing.from_settings(
        TracingSettings(enabled=True, endpoint="http://127.0.0.1:1"), "llmgw-server"
    )
    assert tracing.enabled
    tracing.shutdown()


def test_a_span_names_itself_as_parent_in_its_traceparent() -> None:
    spans = InMemorySpanExporter()
    tracing = Tracing.exporting_to(spans)
    parent = tracing.span("parent")
    child = tracing.span("child", context_of(traceparent(parent)))
    child.end()
    (ended,) = spans.get_finished_spans()
    assert ended.parent is not None and ended.parent.span_id == parent.get_span_context().span_id
    assert ended.context.trace_id == parent.get_span_context().trace_id


def test_a_missing_or_malformed_traceparent_is_no_parent() -> None:
    assert context_of("") is None
    assert context_of(b"00-zz-yy-01") is None
    assert context_of("00-00000000000000000000000000000000-b7ad6b7169203331-01") is None  # all-zero trace id
    assert context_of(PARENT.encode()) is not None


def test_new_traces_are_sampled_at_the_ratio_and_continued_ones_follow_their_parent() -> None:
    spans = InMemorySpanExporter()
    tracing = Tracing.exporting_to(spans, sample_ratio=0.0)
    tracing.span("new").end()
    tracing.span("continued", context_of(PARENT)).end()
    assert [s.name for s in spans.get_finished_spans()] == ["continued"]


def test_sample_ratio_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        TracingSettings(sample_ratio=1.5)
