"""The gateway mounted inside a Starlette app, as the control plane does, and served alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from llmgw.gateway import Gateway, ModelEntry
from llmgw.testing.serving import serving

from .conftest import AUTH, MODEL, MemoryEngine


def control_plane(gateway: Gateway) -> Starlette:
    async def health(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/healthz", health), Mount("/v1", app=gateway.asgi_app())])


async def test_mounted_at_v1_the_gateway_serves_its_routes(gateway: Gateway, engine: MemoryEngine) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    async with serving(control_plane(gateway)) as url, aiohttp.ClientSession(url) as http:
        async with http.get("/v1/models", headers=AUTH) as response:
            assert response.status == 200
            assert [m["id"] for m in (await response.json())["data"]] == [
                "lazy-chat",
                "tiny-chat",
                "tiny-embed",
                "tiny-rerank",
            ]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post("/v1/chat/completions", json=body, headers=AUTH) as response:
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"] == "r1"
        assert engine.requests[0].path == "/v1/chat/completions"
        async with http.get("/healthz") as response:
            assert await response.text() == "ok"


async def test_served_alone_it_answers_lifespan_and_closes_its_client_on_shutdown() -> None:
    gateway = Gateway()
    gateway.catalog.put(ModelEntry(MODEL))
    sent: list[dict[str, Any]] = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    app: Callable[..., Any] = gateway.asgi_app()
    await app({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
