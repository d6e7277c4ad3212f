"""Calling providers: a provider model's request as its API takes it, its health counted.

:class:`ProviderCalls` is an :class:`~llmgw.gateway.upstream.UpstreamClient`
around the gateway's own: a request for a replica of the cluster passes as it
is; one for a provider's entry (``gateway/providers.py``) goes with the
provider's name for the model in place of the catalog's, and, for an Anthropic
provider, as a Messages request whose answer is read back as a chat completion
(:mod:`llmgw.gateway.anthropic_upstream`). Everything else (keys, limits,
usage from the answer's usage fields, streaming, fallbacks) is the path every
request takes.

Each call is counted (:data:`PROVIDER_REQUESTS`, :data:`PROVIDER_FIRST_BYTE`,
:data:`PROVIDER_ERRORS`; docs/metrics.md), and the last failure of each
provider model is kept (:attr:`ProviderCalls.health`) for ``llmgw ctl status``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram

from llmgw.core.providers import ProviderApi
from llmgw.gateway.anthropic_upstream import MessagesAnswer, messages_request
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.upstream import (
    RequestTimedOut,
    Unreachable,
    UpstreamAnswer,
    UpstreamClient,
    UpstreamTimeout,
)

log = logging.getLogger(__name__)

PROVIDER_REQUESTS = Counter(
    "llmgw_provider_requests",
    "Requests sent to providers outside the cluster, by model and the provider's HTTP status "
    "(0: no answer came).",
    ["model", "code"],
)
PROVIDER_FIRST_BYTE = Histogram(
    "llmgw_provider_time_to_first_byte_seconds",
    "Time from a request sent to a provider to its answer's status and headers, by model.",
    ["model"],
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
PROVIDER_ERRORS = Counter(
    "llmgw_provider_errors",
    "Provider failures by model and kind: timeout, refused (no connection, TLS, or the key), 429, 5xx.",
    ["model", "kind"],
)
RETRY_AFTER_S = 5
"""What a client is told to wait when a provider could not be reached."""


@dataclass
class ProviderHealth:
    """What this gateway last saw of one provider model."""

    requests: int = 0
    last_status: int = 0
    last_error: str = ""
    """The last failure, e.g. ``429 at 12:03:04 UTC: rate limited``; empty before any."""
    last_error_at: float = 0.0
    """When it happened (seconds since the epoch)."""


def renamed(body: bytes, upstream: str) -> bytes:
    """A JSON request body with ``model`` set to the provider's name for it."""
    try:
        data = json.loads(body)
    except ValueError:
        return body  # the gateway checked the body; an unreadable one is the provider's to refuse
    if not isinstance(data, dict):
        return body
    data["model"] = upstream
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


class ProviderCalls:
    """An :class:`UpstreamClient`: providers' requests as their API takes them, the rest as they are."""

    def __init__(self, inner: UpstreamClient) -> None:
        self._inner = inner
        self.health: dict[str, ProviderHealth] = {}
        """By provider model: requests sent, the last status and the last error."""

    async def post(
        self,
        endpoint: ReplicaEndpoint,
        path: str,
        body: bytes,
        request_id: bytes,
        traceparent: bytes = b"",
        deadline: float | None = None,
    ) -> UpstreamAnswer:
        provider = endpoint.provider
        if provider is None:
            return await self._inner.post(endpoint, path, body, request_id, traceparent, deadline)
        model = endpoint.model
        health = self.health.setdefault(model, ProviderHealth())
        health.requests += 1
        shape: dict[str, Any] | None = None
        if provider.api is ProviderApi.ANTHROPIC:
            path, body, shape = messages_request(model, path, body, provider.model)
        else:
            body = renamed(body, provider.model)
        started = time.monotonic()
        try:
            answer = await self._inner.post(endpoint, path, body, request_id, traceparent, deadline)
        except (UpstreamTimeout, RequestTimedOut) as error:
            self._failed(model, health, 0, "timeout", str(error))
            raise
        except Unreachable as error:
            self._failed(model, health, 0, "refused", error.reason)
            raise ApiError(
                502,
                f"The provider of model '{model}' could not be reached ({error.reason}). Retry in "
                f"{RETRY_AFTER_S} s; 'llmgw ctl models' shows the provider's last error.",
                "provider_unreachable",
                retry_after=RETRY_AFTER_S,
            ) from error
        PROVIDER_FIRST_BYTE.labels(model).observe(time.monotonic() - started)
        PROVIDER_REQUESTS.labels(model, str(answer.status)).inc()
        health.last_status = answer.status
        if answer.status in (401, 403):
            detail = (await answer.read())[:300].decode("utf-8", "replace")
            answer.release()
            self._failed(model, health, answer.status, "refused", f"the key was refused: {detail}")
            raise ApiError(
                502,
                f"The provider of model '{model}' refused the cluster's key for it (HTTP {answer.status}). "
                "This is the operator's to fix: add the model again with the provider's right key.",
                "provider_auth_failed",
            )
        if answer.status == 429:
            self._failed(model, health, 429, "429", "rate limited")
        elif answer.status >= 500:
            self._failed(model, health, answer.status, "5xx", "server error")
        if shape is not None:
            return MessagesAnswer(answer, shape)
        return answer

    def _failed(self, model: str, health: ProviderHealth, status: int, kind: str, why: str) -> None:
        PROVIDER_ERRORS.labels(model, kind).inc()
        if not status:
            PROVIDER_REQUESTS.labels(model, "0").inc()
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        health.last_error = f"{status or kind} at {stamp} UTC: {why}"[:300]
        health.last_error_at = time.time()
        log.warning("model %s: provider failed (%s): %s", model, kind, why)

    async def close(self) -> None:
        await self._inner.close()
