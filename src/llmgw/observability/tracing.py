"""Tracing with OpenTelemetry: the settings, the off switch, W3C trace context.

A process builds one :class:`Tracing` from its ``tracing`` settings and hands
it to the parts that make spans (the reconciler, the agent's shard starts,
the gateway). Off (the default) it is :data:`TRACING_OFF`: ``enabled`` is
False, and every caller checks that one boolean before it makes a span,
reads a ``traceparent`` or adds one, so tracing off costs one attribute read
per request and nothing else (the SDK is not even imported).

On, spans go to an OTLP/gRPC collector (``tracing.endpoint``) in batches,
sampled at ``tracing.sample_ratio`` for new traces; a span continuing a
remote one (``traceparent`` from a client, or from the control plane on
``StartShard``) follows its parent's decision. The gRPC exporter is the one
chosen because grpcio is already every llmgw process's transport (the agent
stream), so it adds no HTTP client, and 4317 is collectors' default port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes
from pydantic import Field

from llmgw.configfiles import Section

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "TRACING_OFF",
    "Span",
    "SpanKind",
    "Tracing",
    "TracingSettings",
    "context_of",
    "failed",
    "traceparent",
]


class TracingSettings(Section):
    enabled: bool = False
    """Export spans of reconcile passes, replica starts and /v1 requests; off, none is made."""
    endpoint: str = "http://127.0.0.1:4317"
    """The OTLP/gRPC collector spans go to (``http://`` plain, ``https://`` with TLS)."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of new traces kept (1: all); a trace continued from elsewhere follows its parent."""


_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """Where a process's spans go, or nowhere: check :attr:`enabled` before making any."""

    __slots__ = ("_provider", "_tracer", "enabled")

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self.enabled = provider is not None
        """The one boolean checked before anything tracing does."""
        self._tracer = provider.get_tracer("llmgw") if provider is not None else trace.NoOpTracer()

    @classmethod
    def from_settings(cls, settings: TracingSettings, service: str) -> Tracing:
        """Spans exported over OTLP/gRPC to ``settings.endpoint``; :data:`TRACING_OFF` when disabled."""
        if not settings.enabled:
            return TRACING_OFF
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = _provider(service, settings.sample_ratio)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint)))
        return cls(provider)

    @classmethod
    def exporting_to(
        cls, exporter: SpanExporter, service: str = "llmgw", sample_ratio: float = 1.0
    ) -> Tracing:
        """Spans handed to ``exporter`` as each ends (an in-memory exporter, in tests)."""
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider = _provider(service, sample_ratio)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(provider)

    def span(
        self,
        name: str,
        parent: Context | Span | None = None,
        attributes: Attributes = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        start_time: int | None = None,
    ) -> Span:
        """A started span; the caller ends it. ``parent``: a span, a remote context, or none (a new trace)."""
        context = trace.set_span_in_context(parent) if isinstance(parent, Span) else parent
        if context is None:
            context = Context()  # never the ambient context: parents are always said
        return self._tracer.start_span(name, context, kind=kind, attributes=attributes, start_time=start_time)

    def shutdown(self) -> None:
        """Export what is left and stop (at the process's end)."""
        if self._provider is not None:
            self._provider.shutdown()


TRACING_OFF = Tracing()
"""No tracing: nothing made, nothing carried."""


def _provider(service: str, sample_ratio: float) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )


def traceparent(span: Span) -> str:
    """The W3C ``traceparent`` naming ``span`` as the parent (empty for a span not recorded)."""
    context = span.get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def context_of(value: str | bytes) -> Context | None:
    """The remote parent a ``traceparent`` names; None when it is empty or malformed (a new trace)."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    context = _PROPAGATOR.extract({"traceparent": text})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def failed(span: Span, reason: str) -> None:
    """Mark ``span`` as failed with ``reason`` (the caller still ends it)."""
    span.set_status(Status(StatusCode.ERROR, reason))
