"""What a gateway worker answers itself and what it hands to its control plane."""

from __future__ import annotations

import os
from typing import Any

import httpx

from llmgw.controlplane.serving.workerserving import WORKER_HEADER, worker_app


class Recorder:
    """An ASGI app answering 200 with its name and the body it read."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": self.name.encode() + b":" + body})


class Decides:
    body_max = 1024

    def __init__(self) -> None:
        self.loaded_at_run_time = True

    def peek(self) -> bool:
        return self.loaded_at_run_time

    def named_in(self, body: bytes) -> bool:
        return b"m-runtime" in body


async def ask(app: Any, method: str, path: str, body: bytes = b"") -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as client:
        return await client.request(method, path, content=body)


async def test_v1_is_the_workers_once_its_plane_serves_it_and_the_rest_is_the_plane() -> None:
    serving = False
    app = worker_app(Recorder("gateway"), Recorder("plane"), lambda: serving)
    assert (await ask(app, "POST", "/v1/chat/completions", b"{}")).text == "plane:{}"
    serving = True
    answer = await ask(app, "POST", "/v1/chat/completions", b"{}")
    assert answer.text == "gateway:{}"
    assert answer.headers[WORKER_HEADER.decode()] == str(os.getpid())
    for path in ("/api/models", "/metrics", "/", "/leader"):
        answer = await ask(app, "GET", path)
        assert answer.text == "plane:" and WORKER_HEADER.decode() not in answer.headers


async def test_a_request_naming_a_runtime_adapter_is_left_to_the_plane_with_its_whole_body() -> None:
    decides = Decides()
    app = worker_app(Recorder("gateway"), Recorder("plane"), lambda: True, decides)
    named = b'{"model": "m-runtime"}'
    assert (await ask(app, "POST", "/v1/chat/completions", named)).text == "plane:" + named.decode()
    assert (
        await ask(app, "POST", "/v1/chat/completions", b'{"model": "m"}')
    ).text == 'gateway:{"model": "m"}'
    assert (await ask(app, "POST", "/v1/chat/completions", b"x" * 2000)).text == "plane:" + "x" * 2000
    decides.loaded_at_run_time = False  # no such adapter: nothing is read first
    assert (await ask(app, "POST", "/v1/chat/completions", named)).text == "gateway:" + named.decode()
