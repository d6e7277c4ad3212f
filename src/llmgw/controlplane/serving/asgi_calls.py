"""One HTTP request run through an ASGI app in this process: the leader answering a relayed request.

The body reaches the app's ``receive`` chunk by chunk as it arrives; the
answer leaves as chunks as the app sends it, with at most
:data:`ANSWER_AHEAD` messages waiting (a slower reader holds the app). A body
cut off before its end, or a caller that stops reading the answer (the
standby's client went away), is ``http.disconnect`` on ``receive``, as a
direct client's would be; the app then has :data:`DISCONNECT_GRACE_S` to
finish before it is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from llmgw.core.relays import Headers, RelayChunk, RelayRequest
from llmgw.errors import ChannelClosed

log = logging.getLogger(__name__)

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]

ANSWER_AHEAD = 8
"""Answer messages the app may send ahead of the caller reading them."""

DISCONNECT_GRACE_S = 5.0
"""How long the app has to finish after its client went away (or its answer was read whole)."""

DISCONNECT = {"type": "http.disconnect"}


class AnswerBrokeOff(ChannelClosed):
    """The app failed after its answer had started: the caller must not take the answer for whole."""


def _scope(request: RelayRequest) -> dict[str, Any]:
    path, _, query = request.path.partition("?")
    return {
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


async def call_app(
    app: ASGIApp, request: RelayRequest, body: AsyncIterable[bytes]
) -> AsyncIterator[RelayChunk]:
    """Run ``request`` through ``app``, its body read from ``body`` as the app asks, and stream the answer.

    ``body`` ends after the last chunk, or raises :class:`ChannelClosed` when
    the request was cut off. Raises :class:`AnswerBrokeOff` when the app
    fails mid-answer.
    """
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(ANSWER_AHEAD)
    ended = asyncio.Event()
    """The call is over for the caller: the answer was read whole, or the caller went away."""
    chunks = aiter(body)
    body_over = False

    async def next_chunk() -> bytes | None:
        return await anext(chunks, None)

    async def receive() -> dict[str, Any]:
        nonlocal body_over
        if body_over or ended.is_set():
            await ended.wait()
            return DISCONNECT
        reading = asyncio.ensure_future(next_chunk())
        waiting = asyncio.ensure_future(ended.wait())
        try:
            await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            reading.cancel()
        body_over = True
        if reading.cancelled():
            return DISCONNECT
        error = reading.exception()
        if error is not None:
            if not isinstance(error, ChannelClosed):
                log.warning("reading a relayed %s %s failed", request.method, request.path, exc_info=error)
            return DISCONNECT
        data = reading.result()
        if data is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        body_over = False
        return {"type": "http.request", "body": data, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        if not ended.is_set():
            await messages.put(message)

    async def run() -> None:
        try:
            await app(_scope(request), receive, send)
        finally:
            await messages.put(None)

    task = asyncio.create_task(run())
    try:
        status, started, whole = 500, False, False
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
                    whole = True
                    break
        if started and not whole:
            raise AnswerBrokeOff(
                f"the answer to {request.method} {request.path} broke off", "see the leader's log"
            )
        if not started:
            failed = json.dumps({"error": {"message": "the leader failed to answer", "hint": "see its log"}})
            yield RelayChunk(status=500, data=failed.encode())
    finally:
        ended.set()
        while not messages.empty():  # unblock an app waiting to send
            messages.get_nowait()
        try:
            await asyncio.wait({task}, timeout=DISCONNECT_GRACE_S)
        finally:  # also when the caller is cancelled again meanwhile: the app never outlives the call
            if not task.done():
                task.cancel()
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "answering a relayed %s %s failed", request.method, request.path, exc_info=task.exception()
            )
