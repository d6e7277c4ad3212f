"""Forwarding one request to a replica and its answer back to the client.

A request that needs a replica: pick the least loaded ready one (asking for one
on demand and waiting, bounded, when there is none); POST the body as received;
relay the answer (whole, or SSE events as they complete); report usage.

Usage is the engine's own count when it sent one (a stream's usage event, asked
for by the gateway when the client did not). A stream that ended before it (the
client left, a budget cut it short, the replica failed) counts the content
events it relayed as its completion tokens (``usage.tokens_in``, a few byte
counts per chunk: the same count budgets spend as it passes), and its prompt's
tokens are asked of the engine's tokenizer once the answer ended (a count the
router made for the request is reused).

While that happens a watcher task listens on ``receive`` for the client's
``http.disconnect`` and cancels the request's task, which closes the upstream
connection so the engine stops working for nobody. A model's ``request_timeout_s``
is the request's deadline on its engine: the upstream client closes the
connection when it passes, and the client is answered 504 ``request_timeout``
(an error event in a stream already started).

With tracing on, the request is a span (continuing the client's ``traceparent``, if it sent one) and the
engine is sent that span's ``traceparent``; off, ``gateway.tracing.enabled`` is read once, nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.types import Receive, Send

from llmgw.core.engines import adapter_in_body, find_engine
from llmgw.gateway import leaving, metrics
from llmgw.gateway.adapters import AdapterLoadFailed, Adapters
from llmgw.gateway.api_errors import (
    EVENT_STREAM,
    ApiError,
    normalise_engine_error,
    request_timed_out,
    send_bytes,
    sse_error_event,
)
from llmgw.gateway.bodies import RequestFacts, choosing_lora
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.exchange import CLIENT_CLOSED, Exchange
from llmgw.gateway.finding import ReplicaFinder
from llmgw.gateway.knowledge import Retrieved, salted
from llmgw.gateway.limiting import cut_short, limit_message
from llmgw.gateway.messages_call import MessagesCall
from llmgw.gateway.outbound import Telling
from llmgw.gateway.replicas import Lease, ReplicaEndpoint, ReplicaTable
from llmgw.gateway.responses_api import ResponsesCall
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.shaping import AnswerShape, EventShaper, NativeResponses, TranslatedResponses
from llmgw.gateway.sources import SourcesShape
from llmgw.gateway.tokenizing import Tokenizer, prompt_count, prompt_tokens
from llmgw.gateway.upstream import (
    RequestTimedOut,
    Unreachable,
    UpstreamAnswer,
    UpstreamClient,
    UpstreamDropped,
    UpstreamTimeout,
    describe,
    retry_after,
)
from llmgw.gateway.usage import EventFramer, names_prompt, tokens_in, whole_counts
from llmgw.gateway.usage_records import record_of
from llmgw.observability import logcontext
from llmgw.observability.tracing import Span, SpanKind, Tracing, context_of, failed, traceparent

log = logging.getLogger(__name__)


def _end_span(exchange: Exchange, span: Span) -> None:
    span.set_attribute("http.response.status_code", exchange.status)
    span.set_attribute("llmgw.replica", exchange.replica_id)
    span.set_attribute("gen_ai.usage.input_tokens", exchange.prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", exchange.completion_tokens)
    if exchange.status >= 500:
        failed(span, f"answered {exchange.status}")
    span.end()


def _failure_event(shaper: EventShaper | None, message: str, code: str) -> bytes:
    """The event ending a stream the replica failed: in the stream's own shape."""
    if shaper is not None:
        return shaper.error(message, code)
    return sse_error_event(message, code)


class Forwarder:
    """Answers validated requests from replicas: the gateway's request path past its checks.

    Built once by the gateway from its parts; hands what it has to tell to
    :class:`~llmgw.gateway.outbound.Telling` and waits for replicas through
    :class:`~llmgw.gateway.finding.ReplicaFinder`.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        replicas: ReplicaTable,
        adapters: Adapters,
        upstream: UpstreamClient,
        tokenizer: Tokenizer,
        finder: ReplicaFinder,
        telling: Telling,
        tracing: Tracing,
        catalog: GatewayCatalog,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.replicas = replicas
        self.adapters = adapters
        self.upstream = upstream
        self.tokenizer = tokenizer
        self.finder = finder
        self.telling = telling
        self.tracing = tracing
        self._request_ended = telling.request_ended  # bound once: one lookup per request, as before

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
        """Answer a validated request from a replica of ``exchange.model``; report its usage.

        ``strip_usage``: the stream's usage-only event was asked for by the gateway, not the
        client, and is taken out of the answer.
        """
        task = asyncio.current_task()
        assert task is not None
        if self.tracing.enabled:  # the one check tracing costs when off
            self._start_span(exchange, path, stream)
        stop_watching = leaving.watch(exchange, task, receive)
        try:
            await self._forward(exchange, send, path, body, stream, strip_usage, facts)
        except ApiError as error:
            exchange.status = error.status
            raise
        except asyncio.CancelledError:
            if not exchange.client_gone or task.cancelling() > 1:
                raise  # cancelled from outside too (shutdown)
            exchange.status = CLIENT_CLOSED
        finally:
            exchange.finished = True
            stop_watching()
            if exchange.client_gone:
                task.uncancel()  # balance the one cancel() that _client_left asked for
            if exchange.replica_id and exchange.key is not None:
                if exchange.uncounted_prompt and facts is not None and not task.cancelling():
                    exchange.prompt_tokens = await self._prompt_count(exchange, facts)
                exchange.usage_due = False
                self._request_ended(record_of(exchange, exchange.key))
            if exchange.span is not None:
                _end_span(exchange, exchange.span)

    def _start_span(self, exchange: Exchange, path: str, stream: bool) -> None:
        """The request's span, under the client's trace if it sent one; the engine's traceparent."""
        span = exchange.span = self.tracing.span(
            f"POST {path}",
            context_of(exchange.traceparent),
            {
                "http.request.method": "POST",
                "url.path": path,
                "llmgw.model": exchange.model,
                "llmgw.stream": stream,
                "llmgw.request_id": exchange.request_id.decode("latin-1"),
            },
            kind=SpanKind.SERVER,
        )
        exchange.upstream_traceparent = traceparent(span).encode("latin-1")

    async def _forward(
        self,
        exchange: Exchange,
        send: Send,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool,
        facts: RequestFacts | None,
    ) -> None:
        model = exchange.model
        table = self.replicas
        adapter = self.adapters.get(model)
        found = facts.knowledge if facts is not None else None
        if adapter is not None:
            call = facts.responses if facts is not None else None
            await self._forward_adapter(
                exchange, send, path, body, stream, strip_usage, adapter.model, call, found
            )
            return
        call = facts.responses if facts is not None else None
        prompt = facts.prompt if facts is not None else ""
        salt = found.salt if found is not None else ""
        tokens = None
        if (
            prompt
            and facts is not None
            and facts.prompt_request is not None
            and table.router.wants_tokens(model)
        ):
            tokens = await self._tokens(exchange, prompt, facts.prompt_request)
        endpoint = table.pick(model, prompt=prompt, tokens=tokens, salt=salt)
        if endpoint is None:  # the rare case: wait, bounded (finding.py)

            async def pick() -> ReplicaEndpoint | None:
                return table.pick(model, prompt=prompt, tokens=tokens, salt=salt)

            endpoint = await self.finder.find(model, pick)
            if endpoint is None:
                raise self.finder.not_ready(model)
        # flow control on: with every slot taken, wait a turn (queueing.py)
        if self.finder.flow is not None and await self.finder.take_turn(exchange):
            endpoint = table.pick(model, prompt=prompt, tokens=tokens, salt=salt) or endpoint
        path, body, shape = self._for_engine(model, endpoint, path, body, call, found)
        await self._answer(exchange, send, endpoint, path, body, stream, strip_usage, shape)

    def _for_engine(
        self,
        model: str,
        endpoint: ReplicaEndpoint,
        path: str,
        body: bytes,
        call: ResponsesCall | MessagesCall | None,
        found: Retrieved | None = None,
    ) -> tuple[str, bytes, AnswerShape | None]:
        """The route and body as the replica's engine needs them, and how its answer is reshaped.

        A Responses request goes as one to an engine serving the Responses API and as a chat
        completion to any other, a Messages request likewise (one that searched knowledge: always
        as a chat completion); an engine that takes the adapter in the body is told which. A
        request that searched knowledge collections (``found``) carries its sources back, and its
        cache salt to an engine that takes one.
        """
        shape: AnswerShape | None = None
        if call is not None:  # a chat completion has none: no check more on its way
            caps = find_engine(endpoint.engine)
            if isinstance(call, MessagesCall):
                native = call.native() if caps is not None and caps.messages_api and found is None else None
                if native is not None:
                    path, body, shape = "/v1/messages", call.raw, native
                else:
                    shape = call
            elif caps is not None and caps.responses_api:
                path, body, shape = "/v1/responses", call.native_body(), NativeResponses(call)
            else:
                path, body, shape = "/v1/chat/completions", call.chat_body(), TranslatedResponses(call)
        if found is not None:
            shape = SourcesShape(shape, found.sources)
            caps = find_engine(endpoint.engine)
            if caps is not None and caps.cache_salt:
                body = salted(body, found.salt)
        if adapter_in_body(endpoint.engine):
            choice = self.adapters.lora_choice(model)
            if choice is not None:
                return path, choosing_lora(body, choice), shape
        return path, body, shape

    async def _forward_adapter(
        self,
        exchange: Exchange,
        send: Send,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool,
        base: str,
        call: ResponsesCall | MessagesCall | None,
        found: Retrieved | None = None,
    ) -> None:
        """A request naming a LoRA adapter: to a replica of ``base`` holding it (loaded first if need be)."""
        adapters = self.adapters

        async def place() -> ReplicaEndpoint | None:
            try:
                return await adapters.place(exchange.model, exchange.request_id)
            except AdapterLoadFailed as error:
                raise ApiError(502, f"{error}", "adapter_load_failed") from error

        endpoint = await place()
        if endpoint is None:  # wait, bounded: asking for a replica while none holds it (finding.py)
            name = exchange.model
            endpoint = await self.finder.find(base, place, lambda: adapters.servable(name))
            if endpoint is None:
                raise self.finder.not_ready(base, adapter=name)
        try:
            path, body, shape = self._for_engine(exchange.model, endpoint, path, body, call, found)
            await self._answer(exchange, send, endpoint, path, body, stream, strip_usage, shape)
        finally:
            adapters.done(endpoint.replica_id, exchange.model)

    async def _answer(
        self,
        exchange: Exchange,
        send: Send,
        endpoint: ReplicaEndpoint,
        path: str,
        body: bytes,
        stream: bool,
        strip_usage: bool,
        shape: AnswerShape | None = None,
    ) -> None:
        response, lease = await self._connect(exchange, endpoint, path, body)
        clean = False
        try:
            content_type = response.content_type or "application/json"
            if response.status >= 400:
                await self._relay_error(exchange, send, response)
                clean = True
            elif stream and content_type.startswith("text/event-stream"):
                shaper = shape.events() if shape is not None else None
                clean = await self._relay_stream(exchange, send, response, content_type, strip_usage, shaper)
            else:
                await self._relay_whole(exchange, send, response, content_type, shape)
                clean = True
        finally:
            lease.release()
            if clean:
                response.release()
            else:
                # Drop the connection rather than pool it: the engine sees the client is gone.
                response.close()

    async def _tokens(self, exchange: Exchange, prompt: str, request: dict[str, Any]) -> list[int] | None:
        """The prompt's tokens (cached; else from a ready replica's /tokenize); None when unknown."""
        ready = self.replicas.ready(exchange.model)
        return await prompt_tokens(
            self.tokenizer, ready, exchange.model, prompt, request, exchange.request_id
        )

    async def _prompt_count(self, exchange: Exchange, facts: RequestFacts) -> int:
        """The prompt's tokens of a stream that ended before the engine's usage (0: none in time)."""
        if not facts.prompt or facts.prompt_request is None:
            return 0
        ready = self.replicas.ready(exchange.model)
        return await prompt_count(
            self.tokenizer, ready, exchange.model, facts.prompt, facts.prompt_request, exchange.request_id
        )

    async def _connect(
        self, exchange: Exchange, endpoint: ReplicaEndpoint, path: str, body: bytes
    ) -> tuple[UpstreamAnswer, Lease]:
        """Send the request to ``endpoint``, or once to another ready replica when it gives no answer."""
        table = self.replicas
        entry = self.catalog.get(exchange.model)
        limit = entry.request_timeout_s if entry is not None else None
        deadline = asyncio.get_running_loop().time() + limit if limit else None
        tried: list[str] = []
        last: Unreachable | None = None
        dropped: Unreachable | None = None
        """A replica that took the request and dropped it (it was in flight there): 502, not 503."""
        for _ in range(2):
            lease = table.acquire(endpoint)
            exchange.replica_id = ""
            try:
                response = await self.upstream.post(
                    endpoint, path, body, exchange.request_id, exchange.upstream_traceparent, deadline
                )
            except Unreachable as error:
                lease.release()
                last = error
                tried.append(endpoint.replica_id)
                metrics.UPSTREAM_FAILURES.labels(exchange.model, "unreachable").inc()
                log.warning("request %s: %s", exchange.request_id.decode("latin-1"), error)
                if error.connecting:
                    self.telling.replica_failed(endpoint.replica_id, error.reason)
                else:
                    dropped = error
                following = table.pick(exchange.model, exclude=tried)
                if following is None and not error.connecting:
                    following = endpoint  # an open connection dropped: once more on the same replica
                if following is None:
                    break
                endpoint = following
                continue
            except UpstreamTimeout as error:
                lease.release()
                exchange.replica_id = endpoint.replica_id
                raise ApiError(504, f"{error}; retry, or ask for fewer tokens", "upstream_timeout") from error
            except RequestTimedOut as error:
                lease.release()
                exchange.replica_id = endpoint.replica_id
                raise self._timed_out(exchange.model) from error
            except BaseException:  # the client left (cancelled): the replica did see the request
                lease.release()
                exchange.replica_id = endpoint.replica_id
                raise
            exchange.replica_id = endpoint.replica_id
            logcontext.REPLICA.set(endpoint.replica_id)
            return response, lease
        if last is not None and not last.connecting:
            self.telling.replica_failed(last.endpoint.replica_id, last.reason)
        if dropped is not None:
            raise ApiError(
                502,
                f"The replica of model '{exchange.model}' dropped the request before answering "
                f"({dropped.reason}); retry in {self.settings.retry_after_s} s.",
                "upstream_disconnected",
                retry_after=self.settings.retry_after_s,
            )
        raise ApiError(
            503,
            f"No replica of model '{exchange.model}' could be reached; the cluster is replacing it. "
            f"Retry in {self.settings.retry_after_s} s.",
            "replica_unavailable",
            retry_after=self.settings.retry_after_s,
        )

    def _timed_out(self, model: str) -> ApiError:
        entry = self.catalog.get(model)
        return request_timed_out(model, entry.request_timeout_s if entry is not None else None)

    async def _read_all(self, exchange: Exchange, response: UpstreamAnswer) -> bytes:
        try:
            return await response.read()
        except UpstreamTimeout as error:
            raise ApiError(
                504,
                f"The replica stopped answering for {self.settings.upstream_timeout_s:g} s; retry.",
                "upstream_timeout",
            ) from error
        except RequestTimedOut as error:
            raise self._timed_out(exchange.model) from error
        except UpstreamDropped as error:
            metrics.UPSTREAM_FAILURES.labels(exchange.model, "dropped").inc()
            raise ApiError(
                502,
                "The replica dropped the connection before its answer was complete "
                f"({describe(error)}); retry.",
                "upstream_disconnected",
            ) from error

    async def _relay_whole(
        self,
        exchange: Exchange,
        send: Send,
        response: UpstreamAnswer,
        content_type: str,
        shape: AnswerShape | None = None,
    ) -> None:
        body = await self._read_all(exchange, response)
        status = response.status
        if status < 300:
            exchange.prompt_tokens, exchange.completion_tokens, exchange.cached_tokens = whole_counts(body)
            if shape is not None:
                body = await shape.whole(body)
        exchange.status = status
        exchange.finished = True
        exchange.response_started = True
        await send_bytes(send, status, body, exchange.request_id, content_type.encode("latin-1"))

    async def _relay_error(self, exchange: Exchange, send: Send, response: UpstreamAnswer) -> None:
        """An engine's error answer, in OpenAI's shape, with the engine's status."""
        raw = await self._read_all(exchange, response)
        status = response.status
        if status in (401, 403):
            # The replica refused the gateway's own key: not the client's fault.
            log.error("replica %s refused the gateway's key (HTTP %d)", exchange.replica_id, status)
            raise ApiError(
                502,
                f"The replica serving '{exchange.model}' refused the gateway's credentials; "
                "this is a cluster fault, retry later or tell the operator.",
                "replica_auth_failed",
            )
        status, body = normalise_engine_error(status, raw)
        if status == 501:
            # The engine does not do what the request asks (a feature it was not started with):
            # the request's to change, not a fault of the cluster.
            status = 400
        exchange.status = status
        exchange.finished = True
        exchange.response_started = True
        await send_bytes(send, status, body, exchange.request_id, headers=retry_after(response))

    async def _relay_stream(
        self,
        exchange: Exchange,
        send: Send,
        response: UpstreamAnswer,
        content_type: str,
        strip_usage: bool,
        shaper: EventShaper | None = None,
    ) -> bool:
        """Relay SSE events as they complete (reshaped by ``shaper``, if any); True when the replica
        ended the stream itself."""
        exchange.response_started = True
        exchange.status = response.status
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (b"content-type", content_type.encode("latin-1") if content_type else EVENT_STREAM),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                    (b"x-request-id", exchange.request_id),
                ],
            }
        )
        framer = EventFramer(strip_usage_only=strip_usage)
        timer = metrics.StreamTimer(exchange.model, exchange.started)
        failure = b""
        ticket = exchange.ticket
        relayed = 0
        """Completion tokens relayed (content events): the count when the engine's usage never came."""
        try:
            async for chunk in response.iter_any():
                out = framer.feed(chunk)
                if out:
                    tokens = tokens_in(out)
                    sent = await shaper.feed(out) if shaper is not None else out
                    if sent:
                        timer.relayed()
                        if not exchange.first_token:
                            exchange.first_token = time.perf_counter()
                        await send({"type": "http.response.body", "body": sent, "more_body": True})
                    relayed += tokens
                    if ticket is not None and (refusal := ticket.spend(tokens)) is not None:
                        exchange.status = 429
                        if shaper is not None:
                            failure = shaper.error(limit_message(refusal), refusal.code)
                        else:
                            failure = cut_short(refusal)
                        break
        except UpstreamTimeout:
            exchange.status = 504
            failure = _failure_event(
                shaper,
                f"The replica stopped sending for {self.settings.upstream_timeout_s:g} s; retry the request.",
                "upstream_timeout",
            )
        except RequestTimedOut:
            exchange.status = 504
            failure = _failure_event(shaper, self._timed_out(exchange.model).message, "request_timeout")
        except UpstreamDropped as error:
            exchange.status = 502
            metrics.UPSTREAM_FAILURES.labels(exchange.model, "dropped").inc()
            log.warning("replica %s failed mid-stream: %s", exchange.replica_id, describe(error))
            failure = _failure_event(
                shaper,
                f"The replica serving '{exchange.model}' failed mid-answer ({describe(error)}); "
                "retry the request.",
                "upstream_disconnected",
            )
        finally:  # the client gone too (cancelled): what it was sent is counted
            if framer.usage is None:
                exchange.completion_tokens = relayed
                exchange.uncounted_prompt = True
        # After a failure an unfinished event is dropped: the client never saw its start.
        if failure:
            tail = failure
        elif shaper is not None:
            tail = await shaper.feed(framer.flush()) + await shaper.finish()
        else:
            tail = framer.flush()
        if framer.usage is not None:
            exchange.prompt_tokens, exchange.completion_tokens, exchange.cached_tokens = framer.counts()
            exchange.uncounted_prompt = not names_prompt(framer.usage)  # then its tokenizer counts it
        exchange.finished = True
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return not failure
