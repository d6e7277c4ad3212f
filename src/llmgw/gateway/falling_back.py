"""Falling back: a request its model cannot answer goes to the next of the model's fallbacks.

Around :meth:`Forwarder.forward <llmgw.gateway.forwarding.Forwarder.forward>`, once per target:
the model asked for, then its ``fallbacks`` in order (:mod:`llmgw.core.fallbacks`). A request
falls to the next target when the one it tried

- has no ready replica (``no_replica``: the target is asked for one, as on demand, and the request
  does not wait for it while another target remains; the last one waits as any request does);
- answered 429 (``status_429``) or 5xx (``status_5xx``), or could not be reached, dropped the
  request or timed out before answering (``unavailable``);
- sent no first token (a stream's first event, a whole answer) within the asked model's
  ``fallback_ttft_ms`` (``slow_first_token``; its engine's request is closed);
- is skipped by its circuit breaker (``breaker_open``, :mod:`llmgw.core.breakers`): it failed
  ``breaker_failures`` times within ``breaker_window_s``; while another target remains it is not
  tried for ``breaker_open_s``, then one request tries it.

Only while nothing reached the client: :class:`ClientSend` holds an answer's start (status and
headers) until its first body, and holds a failure altogether while another target may take the
request; from the first byte sent on, the request is that target's, whatever happens. Each
further target costs one of the request's retry budget (``gateway.fallbacks.max_targets`` and
``budget_s``, :class:`~llmgw.core.fallbacks.RetryBudget`), and is tried only where the key
sees it, its limits allow it (the models they allow) and it serves the route. When no target
answered, the client gets the last failure as it was given.

Every answer of a forwarded route names the model it ended on in ``x-llmgw-served-by``; the
request is counted (metrics, usage, limits' tokens) against that model. A target a replica took
and that failed is told as its own usage record, with its status and no tokens.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable

from starlette.types import Message, Receive, Send

from llmgw.core.breakers import Breaker, BreakerRule, Breakers
from llmgw.core.fallbacks import RetryBudget
from llmgw.core.requestbounds import check_request
from llmgw.gateway import metrics
from llmgw.gateway.access import Access
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.bodies import RequestFacts, json_body
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.exchange import CLIENT_CLOSED, Exchange
from llmgw.gateway.forwarding import Forwarder
from llmgw.gateway.limiting import Limiter
from llmgw.gateway.outbound import Telling
from llmgw.gateway.replicas import ReplicaTable
from llmgw.gateway.settings import GatewaySettings
from llmgw.observability import logcontext

SERVED_BY = b"x-llmgw-served-by"


def failing(status: int) -> bool:
    """Whether an answer with ``status`` makes a request fall to its next target."""
    return status == 429 or status >= 500


class ClientSend:
    """The client's ``send`` for one target: names the target in :data:`SERVED_BY`; holding, it keeps
    an answer's start until its first body, and a failing answer whole (:attr:`failure`)."""

    __slots__ = (
        "_exchange",
        "_hold",
        "_send",
        "_served_by",
        "_start",
        "failure",
        "failure_body",
        "failure_status",
        "sent",
        "timer",
    )

    def __init__(self, send: Send, exchange: Exchange, served_by: str, hold: bool) -> None:
        self._send = send
        self._exchange = exchange
        self._served_by = served_by.encode()
        self._hold = hold
        self._start: Message | None = None
        self.failure: Message | None = None
        """The start of a failing answer held back (the client saw none of it)."""
        self.failure_body = b""
        self.failure_status = 0
        """The failing answer's status (a stream failed before its first event: the status it ended with)."""
        self.sent = False
        """The first byte went to the client: from now on the request is this target's."""
        self.timer: asyncio.TimerHandle | None = None
        """The first token's deadline, cancelled when the first byte goes."""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message["headers"], (SERVED_BY, self._served_by)]}
            if self._hold:
                self._start = message
                return
            self.sent = True
            await self._send(message)
            return
        if self.failure is not None:
            self.failure_body += message.get("body", b"")
            return
        start = self._start
        if start is not None:
            self._start = None
            ended = not message.get("more_body", False)
            status = start["status"] if failing(start["status"]) else self._exchange.status
            if failing(status) and (ended or status == start["status"]):
                self.failure, self.failure_status = (
                    start,
                    status,
                )  # a stream failed before its first event too
                self.failure_body = message.get("body", b"")
                return
            self.sent = True
            if self.timer is not None:
                self.timer.cancel()
            await self._send(start)
        await self._send(message)

    async def replay(self) -> None:
        """Send the failing answer held back, as it was given."""
        assert self.failure is not None
        self.sent = True
        await self._send(self.failure)
        await self._send({"type": "http.response.body", "body": self.failure_body, "more_body": False})


def with_model(body: bytes, model: str) -> bytes:
    """``body`` (a JSON object) naming ``model``: what the target's engine is sent."""
    data = json.loads(body)
    data["model"] = model
    return json_body(data)


def _afresh(exchange: Exchange, target: str) -> None:
    """The exchange as a new try on ``target`` sees it (nothing of a failed try is kept)."""
    exchange.model = target
    exchange.replica_id = ""
    exchange.status = CLIENT_CLOSED
    exchange.prompt_tokens = exchange.completion_tokens = exchange.cached_tokens = 0
    exchange.response_started = exchange.finished = exchange.uncounted_prompt = False
    exchange.first_token = 0.0
    exchange.usage_due = True
    logcontext.MODEL.set(target)


class FallingBack:
    """Tries a request's targets in turn, each through the forwarder."""

    def __init__(
        self,
        settings: GatewaySettings,
        forwarder: Forwarder,
        catalog: GatewayCatalog,
        replicas: ReplicaTable,
        access: Access,
        limiter: Limiter,
        telling: Telling,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings.fallbacks
        self._forward = forwarder.forward
        self._catalog = catalog
        self._replicas = replicas
        self._access = access
        self._limiter = limiter
        self._telling = telling
        s = self.settings
        rule = BreakerRule(s.breaker_failures, s.breaker_window_s, s.breaker_open_s)
        self.breakers = Breakers(rule, clock)
        """One circuit breaker per target requests fell to or from."""

    async def forward(
        self,
        exchange: Exchange,
        receive: Receive,
        send: Send,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool = False,
        facts: RequestFacts | None = None,
    ) -> None:
        """Answer a validated request from its model or, failing that, from its fallbacks."""
        asked = exchange.model
        entry = self._catalog.get(asked)
        if entry is None or not entry.fallbacks or not self.settings.max_targets:
            try:
                client = ClientSend(send, exchange, asked, False)
                await self._forward(exchange, receive, client, path, body, stream, strip_usage, facts)
            except ApiError as error:
                error.headers = (*error.headers, (SERVED_BY, asked.encode()))
                raise
            return
        targets = [asked, *(t for t in entry.fallbacks if self._may_fall_to(exchange, t, path, facts))]
        budget = RetryBudget(self.settings, exchange.started, time.perf_counter)
        failed: ClientSend | ApiError | None = None
        fell_from = asked
        reason = ""
        for index, target in enumerate(targets):
            if index:
                if budget.spent():
                    break
                budget.take()
                metrics.FALLBACKS.labels(asked, fell_from, target, reason).inc()
            more = index + 1 < len(targets) and budget.left > 0
            breaker = self.breakers.of(target)
            fell_from = target
            if more and not self._replicas.ready(target):
                self._telling.replica_wanted(target)
                reason = "no_replica"
                continue
            if more and not breaker.allows():
                reason = "breaker_open"
                continue
            _afresh(exchange, target)
            exchange.price = self._limiter.prices.of(target)  # the model that answers is the one paid
            client = ClientSend(send, exchange, target, more)
            try:
                ttft = entry.fallback_ttft_s if more else None
                reason = await self._try(
                    exchange, receive, client, target, path, body, stream, strip_usage, facts, ttft
                )
            except ApiError as error:
                if client.sent or not failing(error.status) or not more:
                    self._told(breaker, target, failing(error.status))
                    error.headers = (*error.headers, (SERVED_BY, target.encode()))
                    raise
                failed, reason = error, "unavailable"
                self._told(breaker, target, True)
                continue
            if reason == "client_gone":
                breaker.released()
                return
            self._told(breaker, target, bool(reason))
            if not reason:
                return
            failed = client if client.failure is not None else self._too_slow(target, entry.fallback_ttft_s)
            if not more:
                break
        await self._answer_failure(exchange, send, failed, asked)

    async def _try(
        self,
        exchange: Exchange,
        receive: Receive,
        client: ClientSend,
        target: str,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool,
        facts: RequestFacts | None,
        ttft: float | None,
    ) -> str:
        """One try on ``target``: empty when it answered, else why the request falls on."""
        body, facts = _for_target(body, facts, target)
        task = asyncio.current_task()
        assert task is not None
        slow = False
        if ttft is not None:

            def too_slow() -> None:
                nonlocal slow
                if not client.sent and not exchange.finished:
                    slow = True
                    exchange.status = 504
                    task.cancel()

            client.timer = asyncio.get_running_loop().call_later(ttft, too_slow)
        try:
            await self._forward(exchange, receive, client, path, body, stream, strip_usage, facts)
        except asyncio.CancelledError:
            if not slow:
                raise
            task.uncancel()
            if task.cancelling():
                raise  # cancelled from outside too (shutdown)
            if exchange.client_gone:
                return "client_gone"
            return "slow_first_token"
        finally:
            if client.timer is not None:
                client.timer.cancel()
        if exchange.client_gone:
            return "client_gone"
        if client.failure is not None:
            return "status_429" if client.failure_status == 429 else "status_5xx"
        return ""

    def _may_fall_to(self, exchange: Exchange, target: str, path: str, facts: RequestFacts | None) -> bool:
        """Whether the request may go to ``target``: the key sees it, its limits allow it, it serves
        the route and takes the request's fields."""
        key = exchange.key
        entry = self._catalog.get(target)
        if key is None or entry is None or not entry.visible_to(key.place):
            return False
        if not self._limiter.may_use(key, target):
            return False
        try:
            bounds = self._access.check_task(target, path)
        except ApiError:
            return False
        return facts is None or facts.data is None or check_request(path, facts.data, bounds) is None

    def _too_slow(self, target: str, ttft: float | None) -> ApiError:
        return ApiError(
            504,
            f"The model '{target}' sent no first token within {ttft or 0:g} s, nor did a fallback "
            "answer in time; retry, or ask for fewer tokens.",
            "upstream_timeout",
        )

    def _told(self, breaker: Breaker, target: str, failed: bool) -> None:
        if failed:
            breaker.failed()
        else:
            breaker.succeeded()
        metrics.BREAKER_STATE.labels(target).set(breaker.current())

    async def _answer_failure(
        self, exchange: Exchange, send: Send, failed: ClientSend | ApiError | None, asked: str
    ) -> None:
        """No target answered: the last failure goes to the client as it was given."""
        if isinstance(failed, ClientSend) and failed.failure is not None:
            exchange.status = failed.failure_status
            exchange.response_started = exchange.finished = True
            await failed.replay()
            return
        if isinstance(failed, ApiError):
            raise failed
        breaker = self.breakers.of(asked)
        wait = max(1, round(breaker.retry_after_s()))
        raise ApiError(
            503,
            f"The model '{asked}' and its fallbacks are failing or have no ready replica; retry in {wait} s.",
            "fallbacks_exhausted",
            retry_after=wait,
            headers=((SERVED_BY, exchange.model.encode()),),
        )


def _for_target(body: bytes, facts: RequestFacts | None, target: str) -> tuple[bytes, RequestFacts | None]:
    """The body and facts of a request as sent to ``target``: its ``model`` named so."""
    if facts is None or facts.model == target:
        return body, facts
    if facts.responses is not None:
        call = copy.copy(facts.responses)
        call.model = target
        facts = facts._replace(responses=call)
    return with_model(body, target), facts._replace(model=target)
