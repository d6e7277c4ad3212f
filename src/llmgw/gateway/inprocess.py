"""Requests made inside the process: a ``/v1`` request sent through the gateway as one of its keys.

The leader runs batches by sending each request through its own gateway, so
that a batch's requests take the same path as a client's: the key's limits
and the models it sees, routing, retries, usage. :func:`answer_in_process`
builds the ASGI request and collects the answer; the key is named in the
scope under :data:`IN_PROCESS_KEY`, which only code in this process can set
(a client's request carries its key in ``Authorization``, checked as ever).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import ASGIApp, Message

from llmgw.gateway.keys import KeyEntry

IN_PROCESS_KEY = "llmgw.in_process_key"
"""The scope's entry naming the :class:`KeyEntry` a request made in this process is sent as."""


@dataclass(frozen=True, slots=True)
class InProcessAnswer:
    """What the gateway answered a request made in this process."""

    status: int
    body: bytes
    request_id: str


async def answer_in_process(
    app: ASGIApp, key: KeyEntry, path: str, body: bytes, request_id: str
) -> InProcessAnswer:
    """POST ``body`` to ``path`` through ``app`` as ``key``; its whole answer (never streamed)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
        ],
        "client": None,
        "server": None,
        IN_PROCESS_KEY: key,
    }
    given = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.get_running_loop().create_future()  # no disconnect: the caller waits to the end
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return InProcessAnswer(status, b"".join(chunks), request_id)
