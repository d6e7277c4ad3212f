"""A small OTLP/gRPC collector for end-to-end tests: it records the spans real processes export.

It implements OpenTelemetry's ``TraceService/Export`` (the service definition
of the ``opentelemetry-proto`` package) on a loopback port, in threads of its
own, so a test that runs real control planes and agents (plain functions, no
event loop) points their ``tracing.endpoint`` at :attr:`OtlpCollector.endpoint`
and reads :meth:`OtlpCollector.spans` as they arrive.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["CollectedSpan", "OtlpCollector"]


@dataclass(frozen=True)
class CollectedSpan:
    """One span as it reached the collector: ids in hex, as a ``traceparent`` writes them."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    failed: bool = False


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: OtlpCollector) -> None:
        self._collector = collector

    def Export(  # the service's method name, as gRPC calls it
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received: list[CollectedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        CollectedSpan(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            failed=span.status.code == span.status.STATUS_CODE_ERROR,
                        )
                    )
        self._collector.add(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpCollector:
    """A TraceService on ``127.0.0.1``; :meth:`start` it, point exporters at :attr:`endpoint`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[CollectedSpan] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add_servicer = trace_service_pb2_grpc.add_TraceServiceServicer_to_server  # generated, untyped
        add_servicer(_TraceService(self), self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        """What ``tracing.endpoint`` is set to (plain gRPC, no TLS)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpCollector:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def add(self, spans: list[CollectedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self, name: str | None = None) -> list[CollectedSpan]:
        """Every span received so far (of that name, when one is given), in arrival order."""
        with self._lock:
            return [s for s in self._spans if name is None or s.name == name]

    def __enter__(self) -> OtlpCollector:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
