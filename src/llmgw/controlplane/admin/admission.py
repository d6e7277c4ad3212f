"""What a request must bring before the admin side reads its body: the admin token, and a bounded body.

:class:`Admission` is pure ASGI and stands in front of everything the HTTP
port serves except the gateway (``/v1`` has its own keys and its own 32 MiB
limit, :mod:`llmgw.gateway.bodies`), and in front of a standby's relaying,
which reads a body whole before it passes it on:

- a request with more than one ``Authorization`` header is answered 400, on
  every path (the gateway does so for ``/v1``), rather than one of them
  taken;
- an ``/api`` request without a live token (the admin token, or a user's:
  :class:`~llmgw.controlplane.admin.callers.Callers`, from memory) is answered 401
  from its headers alone, before a byte of its body is read; the public paths
  (:data:`PUBLIC_API_PATHS`, and everything outside ``/api``: ``/healthz``,
  ``/leader``, ``/metrics``, the portal's page and files at ``/`` and
  ``/portal/``, which then call ``/api`` with the token the user signs in
  with) want none;
- a body larger than ``http.api_body_max_bytes`` is answered 413, at once when
  ``Content-Length`` says so, or as soon as the bytes streamed pass it (the
  app behind then sees the client go away). Uploads into the mirror
  (``POST /api/mirror/blobs``) stream into it with a limit of their own.

Neither answer closes the connection: a client still sending the body it
was refused would see a reset rather than the answer. The server reads the
rest and drops it, for no longer than ``http.header_timeout_s``
(:mod:`llmgw.controlplane.serving.httpserving`), then closes. Each ``/api`` route still checks
the token itself
(:func:`llmgw.controlplane.api.state.check_token`): requests a standby relays
reach the leader's app through the agent port, not through this layer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.admin.metricsaccess import METRICS_PATH, metrics_refusal
from llmgw.controlplane.api.state import TWO_TOKENS, TWO_TOKENS_HINT, WRONG_TOKEN, WRONG_TOKEN_HINT
from llmgw.gateway.paths import gateway_path

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]

PUBLIC_API_PATHS = frozenset({"/api/docs", "/api/openapi.json"})
"""Paths under ``/api`` that answer without the token: the API's description."""

UNBOUNDED = frozenset({("POST", "/api/mirror/blobs")})
"""Requests whose body is not bounded here: uploads stream into the mirror, which has its own limit."""


def _wants_token(path: str) -> bool:
    return (path == "/api" or path.startswith("/api/")) and path not in PUBLIC_API_PATHS


def _headers(scope: dict[str, Any]) -> tuple[str | None, str | None, bool]:
    """The request's ``Authorization`` and ``Content-Length``, in one pass, and whether it has more
    than one ``Authorization``."""
    authorization = length = None
    twice = False
    for key, value in scope["headers"]:
        if key == b"authorization":
            twice = twice or authorization is not None
            authorization = str(value.decode("latin-1"))
        elif key == b"content-length":
            length = str(value.decode("latin-1"))
    return authorization, length, twice


def two_authorizations(scope: dict[str, Any]) -> bool:
    """Whether the request has more than one ``Authorization`` header."""
    found = 0
    for key, _ in scope["headers"]:
        found += key == b"authorization"
    return found > 1


async def refuse_two_authorizations(send: Callable[[Any], Awaitable[None]]) -> None:
    """The 400 for a request with more than one ``Authorization`` header."""
    await _answer(send, 400, TWO_TOKENS, TWO_TOKENS_HINT)


async def _answer(send: Callable[[Any], Awaitable[None]], status: int, message: str, hint: str) -> None:
    body = json.dumps({"error": {"message": message, "hint": hint}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyTooLarge:
    """The 413 answer, naming the limit."""

    def __init__(self, limit: int) -> None:
        self.message = f"the request body is larger than the admin API accepts ({limit} bytes)"
        self.hint = (
            "send a smaller body; weights go into the mirror with 'llmgw mirror import' "
            "(POST /api/mirror/blobs), which has a limit of its own; http.api_body_max_bytes in "
            "server.yaml sets this one"
        )


class Admission:
    """Pure ASGI: a live token from the headers, then the body limit, in front of ``app``."""

    def __init__(
        self, app: ASGIApp, callers: Callers, body_max_bytes: int, metrics_address: str = ""
    ) -> None:
        self._app = app
        self._callers = callers
        self._limit = body_max_bytes
        self._metrics_address = metrics_address
        """Where ``/metrics`` is served without a token instead of here (empty: here, with one)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or gateway_path(path):
            await self._app(scope, receive, send)
            return
        authorization, length, twice = _headers(scope)
        if twice:
            await refuse_two_authorizations(send)
            return
        if _wants_token(path) and self._callers.identify(authorization or "") is None:
            await _answer(send, 401, WRONG_TOKEN, WRONG_TOKEN_HINT)
            return
        if path == METRICS_PATH:
            refusal = metrics_refusal(self._callers, authorization or "", self._metrics_address)
            if refusal is not None:
                await _answer(send, refusal.status, refusal.message, refusal.hint)
                return
        if (scope["method"], path) in UNBOUNDED:
            await self._app(scope, receive, send)
            return
        if length is not None and length.strip().isdigit() and int(length) > self._limit:
            too_large = BodyTooLarge(self._limit)
            await _answer(send, 413, too_large.message, too_large.hint)
            return
        await _BoundedRequest(self._limit, receive, send).run(self._app, scope)


class _BoundedRequest:
    """One request whose body is counted as the app reads it; past the limit, 413 and the client is gone."""

    def __init__(self, limit: int, receive: Any, send: Any) -> None:
        self._limit = limit
        self._receive = receive
        self._send = send
        self._received = 0
        self._started = False
        self._refused = False

    async def run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self.receive, self.send)
        except Exception:
            if not self._refused:
                raise
            # the app failed on the body it was refused; the client has its 413 already

    async def receive(self) -> dict[str, Any]:
        if self._refused:
            return {"type": "http.disconnect"}
        message: dict[str, Any] = await self._receive()
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit:
                self._refused = True
                if not self._started:
                    too_large = BodyTooLarge(self._limit)
                    await _answer(self._send, 413, too_large.message, too_large.hint)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: dict[str, Any]) -> None:
        if self._refused:
            return  # the client was answered 413 (or is cut off): what the app says now goes nowhere
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)
