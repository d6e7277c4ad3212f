"""The gateway served by uvicorn in a thread of its own, before an engine that answers anything."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any

from aiohttp import web

from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, ReplicaEndpoint, hash_secret
from llmgw.testing.serving import bound_socket, served_in_thread

SECRET = "sk-llmgw-fuzz-0123456789"
MODEL = "fuzz-chat"


async def _tolerant(request: web.Request) -> web.StreamResponse:
    """An engine that answers every body with a small completion, streamed when asked: the gateway's
    own handling is what is fuzzed, not the engine's."""
    raw = await request.read()
    try:
        stream = json.loads(raw).get("stream") is True
    except (ValueError, RecursionError, AttributeError):
        stream = False
    answer = {"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "text": "ok"}]}
    if not stream:
        return web.json_response(answer)
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: " + json.dumps(answer).encode() + b"\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    return response


@asynccontextmanager
async def _gateway() -> AsyncIterator[Any]:
    """The gateway before a tolerant engine, with one ready replica of ``MODEL`` and the key ``SECRET``."""
    app = web.Application(client_max_size=64 << 20)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize"):
        app.router.add_post(path, _tolerant)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = bound_socket()
    await web.SockSite(runner, sock).start()
    gateway = Gateway(GatewaySettings(request_wait_s=0.3, retry_after_s=1))
    gateway.keys.add(KeyEntry("key-1", "fuzz", hash_secret(SECRET), "user:fuzz"))
    gateway.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    gateway.replicas.set_ready(ReplicaEndpoint("r1", MODEL, endpoint, "replica-key", capacity=64))
    try:
        yield gateway.asgi_app()
    finally:
        await gateway.close()
        await runner.cleanup()


def v1_server() -> AbstractContextManager[str]:
    """The gateway's base URL, served in a thread of its own."""
    return served_in_thread(_gateway)
