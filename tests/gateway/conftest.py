"""The gateway between in-memory engines and an in-memory client: no socket on either side.

The gateway runs on :class:`~llmgw.testing.gateway_doubles.MemoryUpstream`
(``engine``: a :class:`~llmgw.testing.gateway_doubles.MemoryEngine`), tells a
:class:`~llmgw.testing.gateway_doubles.RecordingOutbound` (``hooks``), and is
called by the SDK (``client``, :func:`memory_sdk`) and a raw HTTP client
(``http``) through :mod:`llmgw.testing.asgi_client`. :class:`FakeEngine` is the
same engine over a real aiohttp server, for the tests of every hop over real
sockets (``test_over_sockets.py``) and of the HTTP client (``test_upstream.py``).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web
from multidict import CIMultiDict
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from llmgw.core.engines import Task
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.upstream import UpstreamClient
from llmgw.testing.asgi_client import StreamingAsgiTransport, asgi_client
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream, RecordingOutbound, engine_answer
from llmgw.testing.serving import bound_socket

SECRET = "sk-llmgw-test-0123456789"
MODEL = "tiny-chat"
LAZY = "lazy-chat"
EMBED = "tiny-embed"
"""A model serving embeddings."""
RERANK = "tiny-rerank"
"""A model serving reranking."""
"""A model started on demand: no replica until a request asks."""
WAIT = 5.0
"""Upper bound for awaiting an event that must happen."""
AUTH = {"Authorization": f"Bearer {SECRET}"}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def closed_port() -> int:
    """A loopback port with nothing listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Received:
    path: str
    headers: CIMultiDict[str]
    body: bytes


@dataclass
class FakeEngine:
    """An OpenAI-compatible engine stand-in that records what reaches it."""

    replica_id: str = "r1"
    key: str = "replica-key-r1"
    chunks: int = 3
    """Content chunks in a streamed answer (then a usage chunk when the request asks for it, and [DONE])."""
    hold: asyncio.Event | None = None
    """When set, every answer waits for this event before it starts."""
    hold_after_first: asyncio.Event | None = None
    """When set, a stream waits for this event after its first chunk."""
    cut_after: int | None = None
    """When set, a stream's connection is closed after this many chunks."""
    cut_whole: bool = False
    """When set, a whole (non-streamed) answer's connection is closed halfway through its body."""
    abort_on_arrival: bool = False
    """When set, the connection of every request is closed as soon as the request arrived."""
    error: tuple[int, bytes] | None = None
    """When set, every request is answered with this status and body."""
    requests: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a client's connection went away before its answer ended."""
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> ReplicaEndpoint:
        return ReplicaEndpoint(self.replica_id, MODEL, f"http://127.0.0.1:{self.port}", self.key, capacity=4)

    def endpoint_for(self, model: str = MODEL, engine: str = "llama.cpp") -> ReplicaEndpoint:
        """This engine as a replica of ``model`` run by ``engine``."""
        replica_id = self.replica_id if model == MODEL else f"{self.replica_id}-{model}"
        return ReplicaEndpoint(
            replica_id, model, f"http://127.0.0.1:{self.port}", self.key, capacity=4, engine=engine
        )

    async def start(self) -> None:
        app = web.Application()
        for path in (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/rerank",
            "/v1/responses",
        ):
            app.router.add_post(path, self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        sock = bound_socket()
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        for event in (self.hold, self.hold_after_first):
            if event is not None:
                event.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Received(request.path, request.headers.copy(), body))
        self.arrived.set()
        if self.abort_on_arrival:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            error = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
            return web.json_response(error, status=401)
        data = json.loads(body)
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.error is not None:
                status, raw = self.error
                return web.Response(status=status, body=raw, content_type="application/json")
            if data.get("stream"):
                return await self._stream(request, data)
            if self.cut_whole:
                return await self._cut(request, data)
            return web.json_response(self._answer(request.path, data))
        except (asyncio.CancelledError, ConnectionResetError):
            self.dropped.set()
            raise

    def _answer(self, path: str, data: dict[str, Any]) -> dict[str, Any]:
        return engine_answer(path, data, self.replica_id, len(self.requests))

    async def _cut(self, request: web.Request, data: dict[str, Any]) -> web.StreamResponse:
        body = json.dumps(self._answer(request.path, data)).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        assert request.transport is not None
        request.transport.abort()
        return response

    async def _stream(self, request: web.Request, data: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        def event(payload: dict[str, Any]) -> bytes:
            base = {
                "id": "chunk-1",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": data["model"],
            }
            return b"data: " + json.dumps(base | payload).encode() + b"\n\n"

        for i in range(self.chunks):
            delta = {"index": 0, "delta": {"content": f"{self.replica_id}-{i} "}, "finish_reason": None}
            await response.write(event({"choices": [delta]}))
            if self.cut_after is not None and i + 1 == self.cut_after:
                assert request.transport is not None
                request.transport.abort()
                return response
            if i == 0 and self.hold_after_first is not None:
                await self.hold_after_first.wait()
        options = data.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            usage = {"prompt_tokens": 7, "completion_tokens": self.chunks, "total_tokens": 7 + self.chunks}
            await response.write(event({"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> GatewaySettings:
    """The gateway's settings; a test changes some with
    ``@pytest.mark.parametrize("settings", [{...}], indirect=True)``."""
    changes: dict[str, Any] = getattr(request, "param", {})
    return GatewaySettings(**{"request_wait_s": 0.3, "retry_after_s": 5, **changes})


@pytest.fixture
def upstream(settings: GatewaySettings) -> MemoryUpstream:
    """The replicas' engines, in memory."""
    return MemoryUpstream(settings)


@pytest.fixture
async def engine(upstream: MemoryUpstream) -> AsyncIterator[MemoryEngine]:
    memory = upstream.engine(MemoryEngine())
    yield memory
    await memory.stop()


@pytest.fixture
def hooks() -> RecordingOutbound:
    """What the gateway tells the control plane."""
    return RecordingOutbound()


@pytest.fixture
async def gateway(
    settings: GatewaySettings, upstream: UpstreamClient, hooks: RecordingOutbound
) -> AsyncIterator[Gateway]:
    gw = Gateway(settings, upstream=upstream, outbound=hooks)
    gw.keys.add(
        KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", Place(Owner.parse("user:alice")))
    )
    gw.catalog.replace(
        [
            ModelEntry(MODEL, created=1700000000),
            ModelEntry(LAZY, on_demand=True),
            ModelEntry(EMBED, serves=Task.EMBEDDINGS),
            ModelEntry(RERANK, serves=Task.RERANK),
        ]
    )
    yield gw
    await gw.close()


def memory_sdk(app: Any, secret: str = SECRET) -> AsyncOpenAI:
    """The SDK calling ``app`` in memory (no socket: :mod:`llmgw.testing.asgi_client`); close it."""
    url = "http://gateway.test/v1"
    http = httpx.AsyncClient(transport=StreamingAsgiTransport(app), base_url=url, timeout=WAIT * 2)
    return AsyncOpenAI(base_url=url, api_key=secret, max_retries=0, http_client=http)


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[AsyncOpenAI]:
    """The SDK calling the gateway in memory."""
    async with memory_sdk(gateway.asgi_app()) as sdk:
        yield sdk


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A raw HTTP client for what the SDK cannot send (bad JSON, odd methods), in memory."""
    async with asgi_client(gateway.asgi_app(), "http://gateway.test", timeout=WAIT * 2) as raw:
        yield raw
