"""The ``/v1`` gateway: a pure ASGI app the control plane mounts (or uvicorn serves).

::

    any POST under /v1 while stopped -> 503 system_stopped
    POST /v1/chat/completions | /v1/completions | /v1/embeddings
        key (in memory) -> 401 invalid_api_key
        body: JSON object with "model" -> 400 / 413
        model in the catalog and visible to the key -> 404 model_not_found
        the body's fields within the model's bounds (core/requestbounds.py) -> 400 naming the field
        limits (admission: the ticket is taken and ended here) -> 429
        FallingBack.forward(): the model, then its fallbacks (falling_back.py), each through
        Forwarder.forward(): replica (finding.py: bounded wait -> 503), proxy, usage
        refused past the key (no replica took it): usage with the status, 0 tokens
    POST /v1/messages                  Anthropic's Messages API: the key also from x-api-key, the body
                                       made into a chat completion (messages_api.py) that goes as above,
                                       errors in Anthropic's shape; /v1/messages/count_tokens counts it
    GET  /v1/models, /v1/models/{id}   what the key sees of the catalog
    GET|DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items
                                       the key's kept responses (response_routes.py)

A key sees public models and adapters and those owned at or above its place
(:mod:`llmgw.core.tenancy`); anything else answers as a name never defined.

The control plane changes what the gateway knows only through
:attr:`Gateway.feed` (:class:`~llmgw.gateway.feeding.GatewayFeed`), and
hears back only through the :class:`~llmgw.gateway.outbound.GatewayOutbound`
it passes in. Every
answer carries ``x-request-id`` (the client's, or a new one), and every error
is in OpenAI's shape (Anthropic's on its routes). The app works mounted (``Mount("/v1", app)``, or at the
root) and served directly, where it answers lifespan events too.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw.core.knowledge import KnowledgeSearch
from llmgw.core.requestbounds import check_request
from llmgw.gateway import knowledge, metrics
from llmgw.gateway.access import TWO_AUTHORIZATIONS, Access, model_not_found
from llmgw.gateway.adapters import Adapters
from llmgw.gateway.api_errors import ApiError, error_body, refused, send_bytes, send_error
from llmgw.gateway.batch_routes import BatchBook, BatchRoutes, batch_route
from llmgw.gateway.bodies import RequestFacts, asking_for_usage, json_body, model_and_stream, read_body
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.exchange import CLIENT_CLOSED, Exchange
from llmgw.gateway.falling_back import FallingBack
from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.file_routes import FileBook, FileRoutes, file_route
from llmgw.gateway.files import FileStore
from llmgw.gateway.finding import ReplicaFinder
from llmgw.gateway.forwarding import Forwarder
from llmgw.gateway.gate import GateClient
from llmgw.gateway.inprocess import IN_PROCESS_KEY
from llmgw.gateway.jobs import JobBook, JobFiles, JobRecords, JobRunner, MemoryJobFiles
from llmgw.gateway.keys import KeyEntry, KeyRing
from llmgw.gateway.leaving import departures_of
from llmgw.gateway.limiting import Limiter
from llmgw.gateway.loads import LoadReader
from llmgw.gateway.messages_api import AnthropicError, api_key_header
from llmgw.gateway.messages_call import translated
from llmgw.gateway.outbound import GatewayOutbound, NoOutbound, Telling
from llmgw.gateway.paths import COUNT_TOKENS_ROUTE, ENGINE_ROUTE, FORWARDED, MESSAGES_ROUTES
from llmgw.gateway.provider_calls import ProviderCalls
from llmgw.gateway.replicas import ReplicaTable
from llmgw.gateway.response_routes import ResponseRoutes, response_route
from llmgw.gateway.response_store import ResponseBook, ResponseStore
from llmgw.gateway.responses_api import ResponsesCall
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.tokenizing import Tokenizer, prompt_tokens
from llmgw.gateway.upstream import Upstream, UpstreamClient
from llmgw.gateway.usage import UsageRecord
from llmgw.gateway.workflow_routes import WorkflowRoutes, workflow_route
from llmgw.observability import logcontext
from llmgw.observability.tracing import TRACING_OFF, Tracing

log = logging.getLogger(__name__)
access = logging.getLogger("llmgw.access")
"""One line per /v1 request when ``access_log`` is set."""


COUNTED_BY_USAGE_EVENT = frozenset({"/v1/chat/completions", "/v1/completions"})
"""Streamed routes whose usage comes in a usage-only event the gateway may ask for (``stream_options``)."""


def _route_path(scope: Scope) -> str:
    """The request's path as ``/v1/...``, whether the app is mounted at ``/v1``, at the root or not at all."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    if not path.startswith("/v1/") and root.endswith("/v1"):
        path = "/v1" + path
    return path


_ID_PREFIX = secrets.token_hex(8)
_ID_COUNTER = itertools.count(1)


def _request_id(given: bytes | None) -> bytes:
    """The client's request id when it sent a sane one, else a new one unique across processes."""
    if given and len(given) <= 128 and given.isascii():
        return given
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}".encode()


def _log_access(scope: Scope, exchange: Exchange, duration_s: float) -> None:
    """The access log's line for one request (the request's context fields ride with it)."""
    method: str = scope["method"]
    path: str = scope["path"]
    access.info(
        "%s %s %d %.3fs tokens %d+%d",
        method,
        path,
        exchange.status,
        duration_s,
        exchange.prompt_tokens,
        exchange.completion_tokens,
        extra={
            "fields": {
                "method": method,
                "path": path,
                "status": exchange.status,
                "duration_s": round(duration_s, 6),
                "prompt_tokens": exchange.prompt_tokens,
                "completion_tokens": exchange.completion_tokens,
            }
        },
    )


class Gateway:
    """The ``/v1`` data path: keys, catalog view and ready replicas, all in memory.

    The control plane keeps :attr:`keys`, :attr:`catalog` and :attr:`replicas`
    current through :attr:`feed` and passes in ``outbound``
    (:class:`~llmgw.gateway.outbound.GatewayOutbound`: what the gateway tells
    it) and, in tests, ``upstream`` (how replicas are called; default: HTTP,
    :class:`~llmgw.gateway.upstream.Upstream`). The parts, each built here once:

    - :attr:`access`: keys, visibility and tasks (``access.py``);
    - :attr:`finder`: the one wait for a replica (``finding.py``);
    - :attr:`forwarder`: requests to replicas and back (``forwarding.py``);
    - :attr:`jobs` and :attr:`workflows`: pictures and jobs (``jobs.py``, ``workflow_routes.py``).
    """

    def __init__(
        self,
        settings: GatewaySettings | None = None,
        *,
        keys: KeyRing | None = None,
        replicas: ReplicaTable | None = None,
        catalog: GatewayCatalog | None = None,
        outbound: GatewayOutbound | None = None,
        upstream: UpstreamClient | None = None,
        tracing: Tracing = TRACING_OFF,
        knowledge: KnowledgeSearch | None = None,
        knowledge_relay: ASGIApp | None = None,
        batches: BatchBook | None = None,
        files: FileBook | None = None,
        job_files: JobFiles | None = None,
        jobs: JobRecords | None = None,
        responses: ResponseBook | None = None,
    ) -> None:
        self.settings = settings or GatewaySettings()
        self.tracing = tracing
        """Spans of /v1 requests; off, ``forward`` checks ``tracing.enabled`` once and does nothing else."""
        self.keys = keys if keys is not None else KeyRing()
        self.replicas = replicas if replicas is not None else ReplicaTable()
        self.catalog = catalog if catalog is not None else GatewayCatalog()
        self.upstream: UpstreamClient = upstream if upstream is not None else Upstream(self.settings)
        """How replicas are called (HTTP unless a test passed an in-memory one)."""
        self.providers = ProviderCalls(self.upstream)
        """Forwarded requests: to a provider as its API takes them (its health kept), the rest as they are."""
        self.tokenizer = Tokenizer(self.upstream)
        """Prompt tokens from a replica's /tokenize, for KV-block routing."""
        self.adapters = Adapters(self.replicas, self.upstream)
        """LoRA adapters loaded at run time on their base model's replicas."""
        self.limiter = Limiter()
        """Limits per key, project, team, organization and user, counted in memory."""
        self.responses: ResponseBook = (
            responses
            if responses is not None
            else ResponseStore(
                self.settings.responses_kept_s, self.settings.responses_per_key, self.settings.responses_total
            )
        )
        """Responses kept for previous_response_id and /v1/responses/{id}, per key (docs/openai.md):
        the control plane's book on the store, or this gateway's own memory when none was passed."""
        self.response_routes = ResponseRoutes(self.responses)
        """``/v1/responses/{id}`` (read back, deleted) and its input items."""
        self.feed = GatewayFeed(self.keys, self.catalog, self.replicas, self.adapters, self.limiter)
        """The one way the control plane changes what the gateway knows."""
        self.telling = Telling(outbound if outbound is not None else NoOutbound(), self.feed, self.replicas)
        """The one way out: what requests tell the control plane, each call shielded."""
        self.access = Access(self.keys, self.catalog, self.adapters)
        """Keys, the models each sees and the task each route asks."""
        self.finder = ReplicaFinder(self.settings, self.replicas, self.catalog, self.telling, self.limiter)
        """The bounded wait of a request that found no replica (chat, adapters and jobs alike)."""
        self.forwarder = Forwarder(
            self.settings,
            self.replicas,
            self.adapters,
            self.providers,
            self.tokenizer,
            self.finder,
            self.telling,
            tracing,
            self.catalog,
        )
        """Requests to replicas and their answers back."""
        self.falling_back = FallingBack(
            self.settings,
            self.forwarder,
            self.catalog,
            self.replicas,
            self.access,
            self.limiter,
            self.telling,
        )
        """A request its model cannot answer, to the model's fallbacks in turn (``falling_back.py``)."""
        self.loads = LoadReader(self.replicas)
        """Reads the ready replicas' load from their engines: the process runs :meth:`LoadReader.run`."""
        self.gate = GateClient(self.settings)
        """Calls to ComfyUI replicas' gates (pictures and jobs)."""
        self.files = FileStore(self.settings.files_kept_s, self.settings.files_max_bytes)
        """Files workflows made, readable by the key that asked (``/v1/files/{id}``), when no
        ``job_files`` keep them (the control plane's: in ``/v1/files``)."""
        self.jobs = JobRunner(
            self.settings,
            self.replicas,
            self.finder,
            self.gate,
            job_files if job_files is not None else MemoryJobFiles(self.files),
            JobBook(self.settings.jobs_kept, self.settings.job_kept_s),
            jobs,
        )
        """Workflow runs followed on their replica's gate (``/v1/jobs``, pictures)."""
        self.workflows = WorkflowRoutes(
            self.settings, self.access, self.catalog, self.limiter, self.jobs, self.telling
        )
        """``/v1/images/generations`` and ``/v1/jobs``."""
        self.file_routes = FileRoutes(files, self.files)
        """``/v1/files``, kept by the control plane's :class:`~llmgw.gateway.file_routes.FileBook`
        (None: uploads answer 404), and the files workflows made."""
        self.batch_routes = BatchRoutes(self.access, batches)
        """``/v1/batches``, kept by the control plane's :class:`~llmgw.gateway.batch_routes.BatchBook`
        (None: this gateway answers them 404)."""
        self.knowledge = knowledge
        """Searches knowledge collections for requests that name them (None: such requests answer
        503, unless :attr:`knowledge_relay` takes them)."""
        self.knowledge_relay = knowledge_relay
        """Where a request that searches collections goes when this gateway has no search of its
        own (a gateway worker's control plane): handed on whole, answered there."""
        # the request path's calls, bound once (as cheap as the methods they were)
        self._authenticate = self.access.authenticate
        self._visible = self.access.visible
        self._check_task = self.access.check_task
        self._forward = self.falling_back.forward
        self._request_refused = self.telling.request_refused

    @property
    def stopped(self) -> bool:
        """Whether ``llmgw stop`` holds: every POST answers 503 ``system_stopped``."""
        return self.feed.stopped

    def asgi_app(self) -> ASGIApp:
        """The ASGI app serving ``/v1`` (the gateway itself is that app)."""
        return self

    async def close(self) -> None:
        """Close the upstream connections (call on shutdown, in the serving loop)."""
        self.jobs.close()
        await self.gate.close()
        await self.upstream.close()

    # -- ASGI --------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(receive, send)
            return
        authorization = given_id = length = None
        traceparent = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                # a second one is refused (400) where the key is read, rather than one of them taken
                authorization = value if authorization is None else TWO_AUTHORIZATIONS
            elif name == b"x-request-id":
                given_id = value
            elif name == b"content-length":
                length = value
            elif name == b"traceparent":
                traceparent = value
        exchange = Exchange(_request_id(given_id), traceparent)
        exchange.departures, exchange.headers = departures_of(scope), scope["headers"]
        logcontext.REQUEST_ID.set(exchange.request_id.decode("latin-1"))
        metrics.InFlight.value += 1
        try:
            await self._serve(scope, receive, send, exchange, authorization, length)
        except ApiError as error:
            exchange.status = error.status
            if not exchange.response_started:
                await send_error(send, error, exchange.request_id)
        except Exception:
            log.exception("request %s failed", exchange.request_id.decode("latin-1"))
            if not exchange.response_started:
                exchange.status = 500
                body = error_body("The gateway failed; retry, and report it if it persists.", "server_error")
                await send_bytes(send, 500, body, exchange.request_id)
        finally:
            metrics.InFlight.value -= 1
            if not exchange.relayed:  # a relayed request is counted and logged where it was answered
                duration_s = exchange.elapsed()
                project = metrics.project_of(exchange.key)
                metrics.observe(
                    exchange.model,
                    project,
                    exchange.status,
                    duration_s,
                    exchange.prompt_tokens,
                    exchange.completion_tokens,
                    exchange.cost,
                )
                if exchange.usage_due and exchange.key is not None:  # refused before any replica
                    self._request_refused(
                        UsageRecord(
                            exchange.key.key_id,
                            exchange.model,
                            "",
                            0,
                            0,
                            exchange.status,
                            duration_s,
                            project,
                        )
                    )
                if self.settings.access_log:
                    _log_access(scope, exchange, duration_s)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        authorization: bytes | None,
        length: bytes | None,
    ) -> None:
        path = _route_path(scope)
        method: str = scope["method"]
        if method == "POST" and self.feed.stopped:
            raise ApiError(
                503,
                "The system is stopped: no model is served.",
                "system_stopped",
                hint="an administrator starts it again with `llmgw start`",
            )
        if path in FORWARDED:
            await self._forwarded(scope, receive, send, exchange, path, method, authorization, length)
        elif path in MESSAGES_ROUTES or path == COUNT_TOKENS_ROUTE:
            try:  # Anthropic's key header and error shape on its routes
                key_header = api_key_header(scope["headers"], authorization)
                if path == COUNT_TOKENS_ROUTE:
                    await self._count_tokens(receive, send, exchange, method, key_header, length)
                else:
                    await self._forwarded(
                        scope, receive, send, exchange, path, method, key_header, length, True
                    )
            except ApiError as error:
                raise AnthropicError(error) from error
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            if method != "GET":
                raise ApiError(
                    405, f"{method} is not allowed on {path}; use GET.", headers=((b"allow", b"GET"),)
                )
            key = self._authenticate(authorization)
            self.limiter.refuse_expired(key)  # an expired key sees nothing, as it may ask nothing
            await self._models(send, exchange, path, key)
        elif file_route(path):
            key = exchange.key = self._authenticate(authorization)
            self.limiter.refuse_expired(key)
            await self.file_routes.serve(scope, receive, send, exchange, path, key, length)
        elif response_route(path):
            key = exchange.key = self._authenticate(authorization)
            self.limiter.refuse_expired(key)
            await self.response_routes.serve(scope, send, exchange, path, key)
        elif batch_route(path):
            key = exchange.key = self._authenticate(authorization)
            self.limiter.refuse_expired(key)
            await self.batch_routes.serve(scope, receive, send, exchange, path, key, length)
        elif workflow_route(path):
            await self.workflows.serve(scope, receive, send, exchange, path, authorization, length)
        else:
            raise ApiError(
                404,
                f"Invalid URL ({method} {path}): the gateway serves POST /v1/chat/completions, "
                "/v1/completions, /v1/responses, /v1/messages (and /v1/messages/count_tokens), "
                "/v1/embeddings, /v1/rerank (and /rerank), "
                "/v1/images/generations, /v1/jobs, /v1/files and /v1/batches, GET /v1/models, "
                "/v1/jobs/{id}, /v1/files, /v1/files/{id}(/content), /v1/batches, /v1/responses/{id} and "
                "/v1/responses/{id}/input_items, and DELETE /v1/jobs/{id}, /v1/files/{id} and "
                "/v1/responses/{id}.",
                "unknown_url",
            )

    async def _forwarded(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        path: str,
        method: str,
        authorization: bytes | None,
        length: bytes | None,
        messages: bool = False,
    ) -> None:
        """A request answered by a model's replica: key, visibility, limits, forwarding and usage.

        A Messages request (``/v1/messages``) goes this same way as the chat completion made from it."""
        if method != "POST":
            raise ApiError(
                405, f"{method} is not allowed on {path}; use POST.", headers=((b"allow", b"POST"),)
            )
        # a request made in this process (a batch's) names its key in the scope, where no
        # client can put anything (inprocess.py)
        key = exchange.key = scope.get(IN_PROCESS_KEY) or self._authenticate(authorization)
        exchange.usage_due = True
        logcontext.PROJECT.set(metrics.project_of(key))
        body = await read_body(receive, length, self.settings.max_body_bytes)
        if body is None:
            exchange.status = CLIENT_CLOSED
            return
        if messages:
            translation = translated(body)
            body, path = translation.body, "/v1/chat/completions"
            facts = model_and_stream(body)._replace(responses=translation)
        else:
            facts = model_and_stream(body)
        model = facts.model
        if not self._visible(model, key):
            raise model_not_found(model)
        exchange.model, exchange.price = model, self.limiter.prices.of(model)
        logcontext.MODEL.set(model)
        bounds = self._check_task(model, path)
        if facts.data is not None and (refusal := check_request(path, facts.data, bounds)):
            raise refused(refusal)
        ask = query = None
        if facts.data is not None and (knowledge.FIELD in facts.data or key.collections):
            ask = knowledge.asked(facts.data, key, path)
            if ask is not None:
                if self.knowledge is None and self.knowledge_relay is not None:
                    await self._relay(scope, receive, send, exchange, body)  # admitted there
                    return
                query = knowledge.query_of(facts.data, path)
        # admitted before searching: a key over its limits costs no search. The ticket is
        # taken and ended here, however the request ends; the forwarding only spends from it.
        ticket = exchange.ticket = self.limiter.admit(key, model)
        try:
            if ask is not None and query is not None:
                body, facts = await self._with_knowledge(path, key, facts, ask, query)
            strip_usage = facts.stream and not facts.usage_asked and path in COUNTED_BY_USAGE_EVENT
            if strip_usage:
                body = asking_for_usage(body, facts)  # count its tokens; the client never sees them
            elif path == "/v1/responses" and facts.data is not None:
                call = await ResponsesCall.made(facts.data, key.key_id, self.responses)
                facts = facts._replace(responses=call)
            engine_path = ENGINE_ROUTE.get(path, path)
            await self._forward(exchange, receive, send, engine_path, body, facts.stream, strip_usage, facts)
        finally:
            if ticket is not None:
                ticket.end(exchange.prompt_tokens + exchange.completion_tokens, exchange.costed())

    async def _count_tokens(
        self,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        method: str,
        authorization: bytes | None,
        length: bytes | None,
    ) -> None:
        """``{"input_tokens": N}`` for a Messages request, from its model's tokenizer on a ready replica."""
        if method != "POST":
            raise ApiError(
                405,
                f"{method} is not allowed on {COUNT_TOKENS_ROUTE}; use POST.",
                headers=((b"allow", b"POST"),),
            )
        key = exchange.key = self._authenticate(authorization)
        self.limiter.refuse_expired(key)
        body = await read_body(receive, length, self.settings.max_body_bytes)
        if body is None:
            exchange.status = CLIENT_CLOSED
            return
        facts = model_and_stream(translated(body, counting=True).body)
        if not self._visible(facts.model, key):
            raise model_not_found(facts.model)
        exchange.model = facts.model
        bounds = self._check_task(facts.model, "/v1/chat/completions")  # the chat completion counted
        if facts.data is not None and (refusal := check_request("/v1/chat/completions", facts.data, bounds)):
            raise refused(refusal)
        ready = self.replicas.ready(facts.model)
        request = facts.prompt_request or {}
        tokens = await prompt_tokens(
            self.tokenizer, ready, facts.model, facts.prompt, request, exchange.request_id
        )
        if tokens is None:
            raise ApiError(
                503,
                f"No replica of {facts.model} is ready to count tokens; retry once the model is ready.",
                retry_after=self.settings.retry_after_s,
            )
        exchange.status = 200
        await send_bytes(send, 200, json.dumps({"input_tokens": len(tokens)}).encode(), exchange.request_id)

    async def _with_knowledge(
        self, path: str, key: KeyEntry, facts: RequestFacts, ask: knowledge.Ask, query: str
    ) -> tuple[bytes, RequestFacts]:
        """The body and facts of a request once its collections were searched for ``query``
        (knowledge.py)."""
        assert facts.data is not None
        settings = self.settings
        passages = await knowledge.search(
            self.knowledge, key, ask, query, settings.knowledge_timeout_s, settings.retry_after_s
        )
        body = json_body(knowledge.with_passages(facts.data, path, passages))
        found = knowledge.retrieved(ask.collections, passages)
        return body, model_and_stream(body)._replace(knowledge=found)

    async def _relay(
        self, scope: Scope, receive: Receive, send: Send, exchange: Exchange, body: bytes
    ) -> None:
        """Hand the request (its body already read) to :attr:`knowledge_relay`, which answers it."""
        assert self.knowledge_relay is not None
        exchange.relayed = True
        replayed = [{"type": "http.request", "body": body, "more_body": False}]

        async def again() -> Message:
            return replayed.pop() if replayed else await receive()

        async def started(message: Message) -> None:
            exchange.response_started = True
            await send(message)

        await self.knowledge_relay(scope, again, started)

    async def _models(self, send: Send, exchange: Exchange, path: str, key: KeyEntry) -> None:
        if path == "/v1/models":
            body = self.catalog.listing(key.place)
        else:
            name = path[len("/v1/models/") :]
            entry = self.catalog.visible_to(name, key.place)
            if entry is None:
                raise model_not_found(name)
            body = json.dumps(entry.as_openai(), separators=(",", ":")).encode()
        exchange.status = 200
        exchange.response_started = True
        await send_bytes(send, 200, body, exchange.request_id)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
