"""The gateway served by uvicorn in a thread of its own, before an engine that answers anything."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, ReplicaEndpoint, hash_secret
from llmgw.testing.serving import bound_socket, serving

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


@contextmanager
def v1_server() -> Iterator[str]:
    """The gateway's base URL, with one ready replica of ``MODEL`` and the key ``SECRET``."""
    started = threading.Event()
    stop: list[asyncio.Event] = []
    address: list[str] = []

    async def main() -> None:
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
        async with serving(gateway.asgi_app()) as url:
            address.append(url)
            stop.append(asyncio.Event())
            started.set()
            await stop[0].wait()
        await gateway.close()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the gateway did not start within 30 s")
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(30)
        loop.close()
