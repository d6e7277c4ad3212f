"""Standbys pass ``/api/`` and ``/v1/`` to the leader over the agent port; the leader answers them.

Nodes and replicas live in the leader's memory, so a standby's own view is
empty: it relays each request over gRPC with mutual TLS (its server
certificate is issued for client use too). The leader answers only a
certificate naming a control plane the store lists, and only while it leads,
by running the request through its own ASGI app in this process.

While no control plane leads (a failover), a standby holds the request,
up to the gateway's wait for ``/v1/`` or :data:`API_WAIT_S` for ``/api/``,
and relays it (or serves it itself) as soon as someone leads: a client sees
a slow answer rather than an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from llmgw.controlplane.leadership import Leadership
from llmgw.core.relays import Headers, RelayChunk, RelayPeer, RelayRequest
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized

log = logging.getLogger(__name__)

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]
Relayer = Callable[[str, RelayRequest, float], AsyncIterator[RelayChunk]]
"""Relays a request to the control plane whose agent server is at the given address
(giving up on reaching it after the given seconds)."""

API_WAIT_S = 15.0
"""How long a standby holds an ``/api/`` request while no control plane leads."""

RELAY_CONNECT_S = 1.0
"""How long a standby waits for the leader's agent port before it counts the leader unreachable."""

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "proxy-connection"}


def relayed_paths(path: str) -> bool:
    return path.startswith(("/api/", "/v1/")) or path in ("/api", "/v1")


class RelayAnswering:
    """The leader's side: answer a standby's relayed request with the local app."""

    def __init__(self, app: ASGIApp, leadership: Leadership) -> None:
        self._app = app
        self._leadership = leadership

    async def answer(self, peer: RelayPeer, request: RelayRequest) -> AsyncIterator[RelayChunk]:
        listed = {plane.name for plane in self._leadership.control_planes}
        if not peer.control_plane or peer.name not in listed:
            log.warning(
                "refused a relayed %s %s from certificate %r", request.method, request.path, peer.name
            )
            kind = "names no control plane the store lists" if peer.control_plane else "is a node's"
            raise Unauthorized(
                f"the certificate {peer.name!r} {kind}",
                "only control planes relay; add one with 'llmgw server add'",
            )
        if not self._leadership.serving:
            raise NotLeader(f"control plane {self._leadership.me.name} does not lead", "ask the leader")
        async for chunk in call_app(self._app, request):
            yield chunk


async def call_app(app: ASGIApp, request: RelayRequest) -> AsyncIterator[RelayChunk]:
    """Run one HTTP request through an ASGI app in this process, streaming the answer as chunks."""
    path, _, query = request.path.partition("?")
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in request.headers
        ],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    finished = asyncio.Event()
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await messages.put(None)

    task = asyncio.create_task(run())
    try:
        status, started = 500, False
        headers: Headers = ()
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = tuple(
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])
                )
            elif message["type"] == "http.response.body":
                data = message.get("body", b"")
                if not started:
                    started = True
                    yield RelayChunk(status=status, headers=headers, data=data)
                elif data:
                    yield RelayChunk(data=data)
                if not message.get("more_body", False):
                    break
        if not started:
            body = json.dumps({"error": {"message": "the leader failed to answer", "hint": "see its log"}})
            yield RelayChunk(status=500, data=body.encode())
    finally:
        finished.set()
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await task


class StandbyForwarding:
    """Pure ASGI: serve locally while leading; otherwise relay ``/api/`` and ``/v1/`` to the leader."""

    def __init__(self, local: ASGIApp, leadership: Leadership, relay: Relayer, v1_wait_s: float) -> None:
        self._local = local
        self._leadership = leadership
        self._relay = relay
        self._v1_wait_s = v1_wait_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not relayed_paths(scope["path"]) or self._leadership.serving:
            await self._local(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        wait_s = self._v1_wait_s if scope["path"].startswith("/v1") else API_WAIT_S
        await self._forward(scope, bytes(body), send, time.monotonic() + wait_s)

    async def _forward(self, scope: dict[str, Any], body: bytes, send: Any, deadline: float) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        request = RelayRequest(
            method=scope["method"],
            path=scope["path"] + (f"?{query}" if query else ""),
            headers=tuple(
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in scope["headers"]
                if k.decode("latin-1").lower() not in HOP_BY_HOP
            ),
            body=body,
        )
        while True:
            seen = self._leadership.generation
            if self._leadership.serving:
                await self._local(scope, _replay(body), send)
                return
            leader = self._leadership.leader
            if leader is not None and leader.name != self._leadership.me.name:
                started = False
                try:
                    async for chunk in self._relay(leader.agent_address, request, RELAY_CONNECT_S):
                        if not started:
                            started = True
                            await send(
                                {
                                    "type": "http.response.start",
                                    "status": chunk.status,
                                    "headers": [
                                        (name.encode("latin-1"), value.encode("latin-1"))
                                        for name, value in chunk.headers
                                        if name.lower() not in HOP_BY_HOP
                                    ],
                                }
                            )
                        await send({"type": "http.response.body", "body": chunk.data, "more_body": True})
                    if started:
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                        return
                except Unauthorized as error:
                    await _answer(send, 502, error.message, error.hint)
                    return
                except (ChannelClosed, NotLeader) as error:
                    if started:
                        log.warning("relay to %s broke off: %s", leader.name, error)
                        return
                    log.info("relay to %s failed (%s); waiting for a leader", leader.name, error.message)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await _answer(
                    send,
                    503,
                    "no control plane leads at the moment",
                    "try again in a few seconds; GET /leader on each control plane says which leads",
                )
                return
            await self._leadership.wait_changed(min(remaining, self._leadership.round_s), seen)


def _replay(body: bytes) -> Callable[[], Awaitable[dict[str, Any]]]:
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


async def _answer(send: Any, status: int, message: str, hint: str) -> None:
    body = json.dumps({"error": {"message": message, "hint": hint, "type": "service_unavailable"}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
