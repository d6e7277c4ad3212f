"""The gateway's Prometheus metrics (process-wide, on the default registry).

``model`` is a catalog model's name, or empty for requests refused before a
known model was named (so clients cannot grow the label set); ``project`` is
:func:`project_of` the request's key. Every name is listed in docs/metrics.md.

The request path pays little here: the labelled children of one
``(model, project, code)`` are looked up once and kept together
(:class:`RequestChildren`), a request observes its histogram once, a stream
its time to first token once and each later relayed piece one histogram
observation (:class:`StreamTimer`); the in-flight gauge is read at scrape
time from a plain counter.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from llmgw.gateway.keys import KeyEntry

REQUESTS = Counter(
    "llmgw_gateway_requests",
    "Requests the /v1 gateway answered, by model, project and HTTP status (499: the client went away).",
    ["model", "project", "code"],
)
DURATION = Histogram(
    "llmgw_gateway_request_duration_seconds",
    "Time from a /v1 request's arrival to the end of its answer, by model and project.",
    ["model", "project"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
TIME_TO_FIRST_TOKEN = Histogram(
    "llmgw_gateway_time_to_first_token_seconds",
    "Streams: time from a request's arrival to its first event relayed to the client.",
    ["model"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60),
)
TIME_BETWEEN_TOKENS = Histogram(
    "llmgw_gateway_time_between_tokens_seconds",
    "Streams: time between successive relayed pieces of an answer (each usually one token).",
    ["model"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5),
)
PROMPT_TOKENS = Counter(
    "llmgw_gateway_prompt_tokens",
    "Prompt tokens engines counted in answered /v1 requests, by model and project.",
    ["model", "project"],
)
COMPLETION_TOKENS = Counter(
    "llmgw_gateway_completion_tokens",
    "Tokens engines generated for answered /v1 requests, by model and project.",
    ["model", "project"],
)
COST = Counter(
    "llmgw_gateway_cost",
    "What answered /v1 requests cost at their models' prices (pricing.models.*), in the cluster's "
    "currency (pricing.currency), by model and project.",
    ["model", "project"],
)
IN_FLIGHT = Gauge("llmgw_gateway_requests_in_flight", "/v1 requests being answered now.")
UPSTREAM_FAILURES = Counter(
    "llmgw_gateway_upstream_failures",
    "Replicas the gateway could not reach or that failed mid-answer, by model and reason.",
    ["model", "reason"],
)
FALLBACKS = Counter(
    "llmgw_gateway_fallbacks",
    "Requests that fell from one model to the next of its fallbacks, by the model asked for, the "
    "model fallen from and to, and why (no_replica, status_429, status_5xx, unavailable, "
    "slow_first_token, breaker_open).",
    ["model", "from", "to", "reason"],
)
BREAKER_STATE = Gauge(
    "llmgw_gateway_breaker_state",
    "Each fallback target's circuit breaker as requests last saw it: 0 closed, 1 open, 2 half open.",
    ["model"],
)

QUEUE_DEPTH = Gauge(
    "llmgw_gateway_queue_depth",
    "Requests waiting in the gateway for a slot of a busy model (gateway.flow.mode: fair), by model and "
    "flow (the key's project or user, or the key: gateway.flow.fair_by).",
    ["model", "flow"],
)
QUEUE_WAIT = Histogram(
    "llmgw_gateway_queue_wait_seconds",
    "How long requests sent on from the gateway's queue waited there for a slot, by model and flow.",
    ["model", "flow"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
QUEUE_REFUSED = Counter(
    "llmgw_gateway_queue_refused",
    "Requests the gateway's queue refused with 429, by model and why (queue_full, queue_shed, "
    "queue_timeout).",
    ["model", "reason"],
)


def project_of(key: KeyEntry | None) -> str:
    """The project (or user) a request is counted under: where its key sits (:attr:`KeyEntry.project`);
    empty without a key. The one place that says so: metrics, logs and usage all ask here."""
    return "" if key is None else key.project


class InFlight:
    """Requests being answered now, summed over every gateway in the process."""

    value = 0


IN_FLIGHT.set_function(lambda: InFlight.value)


class RequestChildren:
    """The labelled children one ``(model, project, code)`` counts into, bound once."""

    __slots__ = ("completion", "cost", "duration", "prompt", "requests")

    def __init__(self, model: str, project: str, code: int) -> None:
        self.requests = REQUESTS.labels(model, project, str(code))
        self.duration = DURATION.labels(model, project)
        self.prompt = PROMPT_TOKENS.labels(model, project)
        self.completion = COMPLETION_TOKENS.labels(model, project)
        self.cost = COST.labels(model, project)


_children: dict[tuple[str, str, int], RequestChildren] = {}


def observe(
    model: str,
    project: str,
    code: int,
    duration_s: float,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    cost: float = 0.0,
) -> None:
    """Count one answered request, its duration, its tokens and its cost."""
    children = _children.get((model, project, code))
    if children is None:
        children = _children[(model, project, code)] = RequestChildren(model, project, code)
    children.requests.inc()
    children.duration.observe(duration_s)
    if prompt_tokens:
        children.prompt.inc(prompt_tokens)
    if completion_tokens:
        children.completion.inc(completion_tokens)
    if cost > 0:
        children.cost.inc(cost)


_stream_children: dict[str, tuple[Histogram, Histogram]] = {}


class StreamTimer:
    """One stream's timing: the first relayed piece observed as time to first token, each later one
    as the time since the one before."""

    __slots__ = ("_between", "_first", "_last", "_started")

    def __init__(self, model: str, started: float) -> None:
        pair = _stream_children.get(model)
        if pair is None:
            pair = _stream_children[model] = (
                TIME_TO_FIRST_TOKEN.labels(model),
                TIME_BETWEEN_TOKENS.labels(model),
            )
        self._first, self._between = pair
        self._started = started
        self._last = 0.0

    def relayed(self) -> None:
        """A piece of the answer went to the client now."""
        now = time.perf_counter()
        if self._last:
            self._between.observe(now - self._last)
        else:
            self._first.observe(now - self._started)
        self._last = now
