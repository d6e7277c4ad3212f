"""One ``/v1`` request's state while the gateway answers it: what every part of the request path writes.

Made by the app (``app.py``) for each request; the forwarding, the workflow
routes and the admission of its limits write into it; the app reads it at
the end for the metrics and the access log.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Send

from llmgw.core.pricing import Price
from llmgw.gateway.api_errors import send_bytes
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.limiting import Ticket
from llmgw.observability.tracing import Span

if TYPE_CHECKING:
    from llmgw.gateway.leaving import Departures

CLIENT_CLOSED = 499
"""Status recorded for a request whose client went away before its answer ended."""


class Exchange:
    """One ``/v1`` request's state while the gateway answers it."""

    __slots__ = (
        "cached_tokens",
        "client_gone",
        "completion_tokens",
        "cost",
        "departures",
        "finished",
        "first_token",
        "headers",
        "key",
        "model",
        "price",
        "prompt_tokens",
        "relayed",
        "replica_id",
        "request_id",
        "response_started",
        "span",
        "started",
        "status",
        "ticket",
        "traceparent",
        "uncounted_prompt",
        "upstream_traceparent",
        "usage_due",
    )

    def __init__(self, request_id: bytes, traceparent: bytes = b"") -> None:
        self.request_id = request_id
        self.traceparent = traceparent
        """The client's W3C trace context (continued only with tracing on)."""
        self.span: Span | None = None
        self.upstream_traceparent = b""
        """What the engine is sent as ``traceparent``: empty (none sent) unless tracing is on."""
        self.started = time.perf_counter()
        self.status = CLIENT_CLOSED
        self.model = ""
        self.key: KeyEntry | None = None
        self.replica_id = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        """Prompt tokens the engine found in its cache (where it says)."""
        self.price: Price | None = None
        """The model's price when the request was admitted (None: it has none)."""
        self.cost = 0.0
        """What the request cost (:meth:`costed`, once its tokens are known)."""
        self.response_started = False
        self.finished = False
        """Set before the answer's last bytes are sent: from then on a disconnect changes nothing."""
        self.client_gone = False
        self.departures: Departures | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        """The request's headers as the server gave them (read only off the common path: a queued
        request's priority and deadline)."""
        """The client connection's callbacks for its loss, where the HTTP server gives them."""
        self.first_token = 0.0
        """When the first event of a stream was relayed (``perf_counter``; 0: none was)."""
        self.ticket: Ticket | None = None
        """The request's hold on its limits (None: nothing limits its key)."""
        self.relayed = False
        """Handed whole to another gateway (a worker's control plane), which answers and counts it."""
        self.uncounted_prompt = False
        """A stream ended before the engine's usage: its prompt's tokens are still to be counted."""
        self.usage_due = False
        """The request is one usage counts (a key's request to a route replicas answer) and its
        record was not told yet: told by the forwarding once a replica took it, else by the app,
        as refused with its status."""

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def costed(self) -> float:
        """What the request cost at its model's price, from its tokens as counted now (kept in ``cost``)."""
        price = self.price
        if price is not None:
            self.cost = price.cost(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
        return self.cost


async def send_json(send: Send, exchange: Exchange, status: int, value: Any) -> None:
    """Answer ``value`` as JSON with ``status``, recorded on the exchange."""
    exchange.status, exchange.response_started = status, True
    await send_bytes(send, status, json.dumps(value, separators=(",", ":")).encode(), exchange.request_id)
