"""The gateway's Prometheus metrics (process-wide, on the default registry).

``model`` is a catalog model's name, or empty for requests refused before a
known model was named (so clients cannot grow the label set). Labelled
children are looked up once and kept, and the in-flight gauge is read at
scrape time from a plain counter: a request pays about a microsecond here.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "llmgw_gateway_requests",
    "Requests the /v1 gateway answered, by model and HTTP status (499: the client went away).",
    ["model", "status"],
)
DURATION = Histogram(
    "llmgw_gateway_request_duration_seconds",
    "Time from a /v1 request's arrival to the end of its answer, by model.",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
IN_FLIGHT = Gauge("llmgw_gateway_requests_in_flight", "/v1 requests being answered now.")
UPSTREAM_FAILURES = Counter(
    "llmgw_gateway_upstream_failures",
    "Replicas the gateway could not reach or that failed mid-answer, by model and reason.",
    ["model", "reason"],
)


class InFlight:
    """Requests being answered now, summed over every gateway in the process."""

    value = 0


IN_FLIGHT.set_function(lambda: InFlight.value)

_children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}


def observe(model: str, status: int, duration_s: float) -> None:
    """Count one answered request."""
    pair = _children.get((model, status))
    if pair is None:
        pair = _children[(model, status)] = (REQUESTS.labels(model, str(status)), DURATION.labels(model))
    counter, histogram = pair
    counter.inc()
    histogram.observe(duration_s)
