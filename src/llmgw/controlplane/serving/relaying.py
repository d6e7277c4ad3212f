"""Standbys pass ``/api/`` and ``/v1/`` to the leader over the agent port; the leader answers them.

Nodes and replicas live in the leader's memory, so a standby's own view is
empty: it relays each request over gRPC with mutual TLS (its server
certificate is issued for client use too), one call per request. The call
streams both ways: the head, then the body as the client sends it (never
held whole), then the answer as the leader's app writes it. The leader
answers only a certificate naming a control plane the store lists, and only
while it leads, by running the request through its own ASGI app in this
process. A client that goes away from the standby cancels the call, which the
leader's app sees as ``http.disconnect`` (so the gateway cancels the engine's
request as it does for a client of its own).

A standby that holds a full copy of the leader's gateway state
(``controlplane/statesharing/statestream.py``) serves ``/v1/`` itself instead
(``serves_v1``), leader or none: only ``/api/`` is relayed then, and the
requests whose decision stays with the leader (``leader_decides``: those
naming an adapter loaded at run time, so that one plane alone loads
adapters on replicas). To tell those, the standby reads such a request's
whole body first (only while the catalog has runtime adapters: ``peek``).

While no control plane leads (a failover), a standby holds the request,
up to the gateway's wait for ``/v1/`` or :data:`API_WAIT_S` for ``/api/``,
and relays it (or serves it itself) as soon as someone leads: a client sees
a slow answer rather than an error. The body's first :data:`REPLAY_LIMIT`
bytes are kept for that; a request whose longer body was already on its way
to a leader that then failed is answered 503, to be sent again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from llmgw.controlplane.lifecycle.leadership import Leadership
from llmgw.controlplane.serving.asgi_calls import ASGIApp, call_app
from llmgw.core.relays import IncomingRelay, RelayChunk, RelayPeer, RelayRequest
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.gateway.paths import ROOT_ROUTES, gateway_path
from llmgw.store.leases import ControlPlaneRecord

log = logging.getLogger(__name__)

Relayer = Callable[[str, RelayRequest, AsyncIterable[bytes], float], AsyncIterator[RelayChunk]]
"""Relays a request and its body to the control plane whose agent server is at the given address
(giving up on reaching it after the given seconds)."""

API_WAIT_S = 15.0
"""How long a standby holds an ``/api/`` request while no control plane leads."""

RELAY_CONNECT_S = 1.0
"""How long a standby waits for the leader's agent port before it counts the leader unreachable."""

REPLAY_LIMIT = 1 << 20
"""Body bytes a standby keeps so that it can send them again when the leader fails before answering."""

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "proxy-connection"}


LOCAL_PATHS = frozenset({"/api/control-plane/restart"})
"""Paths every control plane answers itself: they are about the process asked."""


class LeaderDecides(Protocol):
    """Which ``/v1`` requests a standby serving ``/v1`` itself still relays to the leader."""

    body_max: int
    """The longest body read to tell (longer ones are relayed)."""

    def peek(self) -> bool:
        """Whether any request may be one (else none is read first)."""
        ...

    def named_in(self, body: bytes) -> bool:
        """Whether the request with this body is one."""
        ...


def relayed_paths(path: str) -> bool:
    if path in LOCAL_PATHS:
        return False
    return path.startswith(("/api/", "/v1/")) or path in ("/api", "/v1") or path in ROOT_ROUTES


class RelayAnswering:
    """The leader's side: answer a standby's relayed request with the local app."""

    def __init__(self, app: ASGIApp, leadership: Leadership) -> None:
        self._app = app
        self._leadership = leadership

    async def answer(self, peer: RelayPeer, incoming: IncomingRelay) -> AsyncIterator[RelayChunk]:
        """Check the sender's certificate and this control plane's leadership, then read the request."""
        listed = {plane.name for plane in self._leadership.control_planes}
        if not peer.control_plane or peer.name not in listed:
            log.warning("refused a relayed request from certificate %r", peer.name)
            kind = "names no control plane the store lists" if peer.control_plane else "is a node's"
            raise Unauthorized(
                f"the certificate {peer.name!r} {kind}",
                "only control planes relay; add one with 'llmgw server add'",
            )
        if not self._leadership.serving:
            raise NotLeader(f"control plane {self._leadership.me.name} does not lead", "ask the leader")
        request = await incoming.head()
        async for chunk in call_app(self._app, request, incoming.body()):
            yield chunk


class _ClientGone(Exception):
    """The standby's client went away while its body was being relayed."""


class _ClientBody:
    """A client's request body, read from ``receive`` only as fast as a relay sends it on."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]], keep: int = REPLAY_LIMIT) -> None:
        self._receive = receive
        self._keep = keep
        self._kept: list[bytes] = []
        self._kept_bytes = 0
        self.replayable = True
        """Every byte read so far is kept: the body can be sent again from its start."""
        self.whole = asyncio.Event()
        self.gone = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body from its start: the kept bytes, then the rest as the client sends it."""
        for data in list(self._kept):
            yield data
        while not self.whole.is_set():
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise _ClientGone("the client went away")
            data = message.get("body", b"")
            if self.replayable:
                self._kept_bytes += len(data)
                self._kept.append(data)
                if self._kept_bytes > self._keep:
                    self._kept.clear()
                    self.replayable = False
            if not message.get("more_body", False):
                self.whole.set()
            if data:
                yield data

    def receive_from_start(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        """An ASGI ``receive`` giving the body from its start, then what the client's gives."""
        chunks = self.chunks()
        over = False

        async def receive() -> dict[str, Any]:
            nonlocal over
            if over:
                return await self._receive()
            try:
                data = await anext(chunks)
            except StopAsyncIteration:
                over = True
                return {"type": "http.request", "body": b"", "more_body": False}
            except _ClientGone:
                over = True
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": data, "more_body": True}

        return receive

    async def read_whole(self) -> bytes | None:
        """The whole body (kept, so it can be sent on from its start); None when it is longer than
        kept bodies may be, or the client went away."""
        try:
            async for _ in self.chunks():
                if not self.replayable:
                    return None
        except _ClientGone:
            return None
        return b"".join(self._kept) if self.replayable else None

    async def disconnected(self) -> None:
        """Returns once the client went away after sending its whole body."""
        await self.whole.wait()
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True


class StandbyForwarding:
    """Pure ASGI: serve locally while leading; otherwise relay ``/api/`` and ``/v1/`` to the leader."""

    def __init__(
        self,
        local: ASGIApp,
        leadership: Leadership,
        relay: Relayer,
        v1_wait_s: float,
        serves_v1: Callable[[], bool] = lambda: False,
        leader_decides: LeaderDecides | None = None,
    ) -> None:
        self._local = local
        self._leadership = leadership
        self._relay = relay
        self._v1_wait_s = v1_wait_s
        self._serves_v1 = serves_v1
        self._leader_decides = leader_decides

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not relayed_paths(scope["path"]) or self._leadership.serving:
            await self._local(scope, receive, send)
            return
        if gateway_path(scope["path"]) and self._serves_v1():
            decides = self._leader_decides
            if scope["method"] != "POST" or decides is None or not decides.peek():
                await self._local(scope, receive, send)
                return
            body = _ClientBody(receive, keep=decides.body_max)
            data = await body.read_whole()
            if body.gone:
                return
            if data is not None and not decides.named_in(data):
                await self._local(scope, body.receive_from_start(), send)
                return
            await self._forward(scope, body, send, time.monotonic() + self._v1_wait_s)
            return
        wait_s = self._v1_wait_s if gateway_path(scope["path"]) else API_WAIT_S
        await self._forward(scope, _ClientBody(receive), send, time.monotonic() + wait_s)

    async def _forward(self, scope: dict[str, Any], body: _ClientBody, send: Any, deadline: float) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        request = RelayRequest(
            method=scope["method"],
            path=scope["path"] + (f"?{query}" if query else ""),
            headers=tuple(
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in scope["headers"]
                if k.decode("latin-1").lower() not in HOP_BY_HOP
            ),
        )
        while True:
            seen = self._leadership.generation
            if not body.replayable:
                await _answer(
                    send,
                    503,
                    "the leader changed while this request's body was on its way to it",
                    "send the request again",
                )
                return
            if self._leadership.serving:
                await self._local(scope, body.receive_from_start(), send)
                return
            leader = self._leadership.leader
            if leader is not None and leader.name != self._leadership.me.name:
                if await self._relay_watched(leader, request, body, send):
                    return
                if not body.replayable:
                    continue  # answered at once: waiting would not help
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

    async def _relay_watched(
        self, leader: ControlPlaneRecord, request: RelayRequest, body: _ClientBody, send: Any
    ) -> bool:
        """Relay while watching for the client to go away (which cancels the relay); False when the
        leader could not answer and the request may wait for another."""
        relaying = asyncio.ensure_future(self._relay_once(leader, request, body, send))
        watching = asyncio.ensure_future(body.disconnected())
        try:
            await asyncio.wait({relaying, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not relaying.done():
                relaying.cancel()
            await asyncio.wait({relaying, watching})
        if relaying.cancelled():
            log.info("the client of a relayed %s %s went away", request.method, request.path)
            return True
        return relaying.result()

    async def _relay_once(
        self, leader: ControlPlaneRecord, request: RelayRequest, body: _ClientBody, send: Any
    ) -> bool:
        started = False
        try:
            async for chunk in self._relay(leader.agent_address, request, body.chunks(), RELAY_CONNECT_S):
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
                if chunk.data:
                    await send({"type": "http.response.body", "body": chunk.data, "more_body": True})
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return True
            log.warning(
                "%s ended a relayed %s %s without answering", leader.name, request.method, request.path
            )
        except Unauthorized as error:
            await _answer(send, 502, error.message, error.hint)
            return True
        except _ClientGone:
            return True
        except (ChannelClosed, NotLeader) as error:
            if started or body.gone:
                log.warning("relay to %s broke off: %s", leader.name, error)
                return True  # the client sees the answer cut off
            log.info("relay to %s failed (%s); waiting for a leader", leader.name, error.message)
        return False


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
