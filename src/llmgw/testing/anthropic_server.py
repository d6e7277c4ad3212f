"""A server speaking Anthropic's Messages API, standing for a hosted Anthropic provider.

Written from Anthropic's public API reference, version ``2023-06-01`` (the
``anthropic-version`` it demands): https://docs.anthropic.com/en/api/messages
(request and response), .../en/api/messages-streaming (the event order) and
.../en/api/errors (the error shape and types). What it does:

- ``POST /v1/messages`` with ``x-api-key`` (or ``Authorization: Bearer``, which the
  ``anthropic`` SDK 2.16 sends with ``anthropic-version: 2026-10-21``; 401
  ``authentication_error`` when wrong) and ``anthropic-version`` (400 when
  absent); ``model``, ``max_tokens``
  and a non-empty ``messages`` list are required (400 ``invalid_request_error``);
- the answer echoes the last user turn (``Echo: ...``), one output token per
  word, cut at ``max_tokens`` (``stop_reason: max_tokens``) or at the first of
  ``stop_sequences`` found (``stop_sequence``, named); ``tool_choice`` of
  ``any`` or ``tool`` answers one ``tool_use`` block (``stop_reason: tool_use``);
- ``usage.input_tokens`` counts the words of ``system`` and every turn;
- ``stream: true``: ``message_start``, ``content_block_start``, ``ping``,
  ``content_block_delta`` (``text_delta`` / ``input_json_delta``) per token,
  ``content_block_stop``, ``message_delta`` (``stop_reason``, ``usage.output_tokens``),
  ``message_stop``, each as ``event:`` + ``data:`` SSE;
- errors as ``{"type": "error", "error": {"type": ..., "message": ...}}``; set
  :attr:`AnthropicStandin.rate_limited` for 429 ``rate_limit_error`` with
  ``retry-after``, :attr:`AnthropicStandin.overloaded` for 529 ``overloaded_error``,
  :attr:`AnthropicStandin.delay_s` to wait before answering (a provider timing out).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmgw.gateway.messages_events import sse

API_VERSION = "2023-06-01"


@dataclass
class Seen:
    """One request the stand-in received."""

    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class AnthropicStandin:
    """The stand-in's key, what it was sent, and how it misbehaves."""

    key: str = "sk-ant-standin"
    requests: list[Seen] = field(default_factory=list)
    rate_limited: bool = False
    """Answer 429 ``rate_limit_error`` with ``retry-after: 17``."""
    overloaded: bool = False
    """Answer 529 ``overloaded_error``."""
    delay_s: float = 0.0
    """Seconds to wait before the answer's status line."""
    in_flight: int = 0
    most_in_flight: int = 0


def error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """An error answer in the Messages API's shape."""
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _words(content: Any) -> list[str]:
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):
        return [w for block in content if isinstance(block, dict) for w in str(block.get("text", "")).split()]
    return []


def _problem(body: Any) -> str:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required (an integer of at least 1)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{index}.role: Input should be 'user' or 'assistant'"
    return ""


def answer_of(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str | None, int, int]:
    """Content blocks, stop reason, stop sequence, input and output tokens of a valid request."""
    system = _words(body.get("system", ""))
    turns = [w for m in body["messages"] for w in _words(m.get("content"))]
    users = [m for m in body["messages"] if m.get("role") == "user"]
    last = _words(users[-1].get("content")) if users else []
    input_tokens = len(system) + len(turns)
    choice = body.get("tool_choice") or {}
    tools = body.get("tools") or []
    if tools and choice.get("type") in ("any", "tool"):
        name = choice.get("name") or tools[0].get("name", "")
        block = {"type": "tool_use", "id": "toolu_standin", "name": name, "input": {"echo": " ".join(last)}}
        return [block], "tool_use", None, input_tokens, 5
    words = ["Echo:", *last]
    text, reason, matched = " ".join(words[: body["max_tokens"]]), "end_turn", None
    if len(words) > body["max_tokens"]:
        reason = "max_tokens"
    for stop in body.get("stop_sequences") or ():
        if stop in text:
            text, reason, matched = text[: text.index(stop)], "stop_sequence", stop
            break
    return [{"type": "text", "text": text}], reason, matched, input_tokens, len(text.split())


def build_app(standin: AnthropicStandin) -> web.Application:
    """The stand-in's aiohttp app."""

    async def messages(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        standin.requests.append(Seen(dict(request.headers), body if isinstance(body, dict) else {}))
        standin.in_flight += 1
        standin.most_in_flight = max(standin.most_in_flight, standin.in_flight)
        try:
            return await _answer(request, body)
        finally:
            standin.in_flight -= 1

    async def _answer(request: web.Request, body: Any) -> web.StreamResponse:
        if standin.delay_s:
            await asyncio.sleep(standin.delay_s)  # the provider being slow is what is simulated
        given = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix(
            "Bearer "
        )
        if given != standin.key:
            return error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        if standin.rate_limited:
            return error(
                429,
                "rate_limit_error",
                "Number of requests has exceeded your rate limit",
                {"retry-after": "17"},
            )
        if standin.overloaded:
            return error(529, "overloaded_error", "Overloaded")
        if problem := _problem(body):
            return error(400, "invalid_request_error", problem)
        blocks, reason, matched, input_tokens, output_tokens = answer_of(body)
        message_id = f"msg_standin_{len(standin.requests)}"
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": blocks,
                    "stop_reason": reason,
                    "stop_sequence": matched,
                    "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
                }
            )
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(request)
        start = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }
        await stream.write(sse("message_start", {"message": start}))
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                await stream.write(
                    sse(
                        "content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}
                    )
                )
                await stream.write(sse("ping", {}))
                for piece in re.findall(r"\s*\S+\s*", block["text"]):  # one token a word, spaces kept
                    delta = {"type": "text_delta", "text": piece}
                    await stream.write(sse("content_block_delta", {"index": index, "delta": delta}))
            else:
                opened = {**block, "input": {}}
                await stream.write(sse("content_block_start", {"index": index, "content_block": opened}))
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                await stream.write(sse("content_block_delta", {"index": index, "delta": delta}))
            await stream.write(sse("content_block_stop", {"index": index}))
        await stream.write(
            sse(
                "message_delta",
                {
                    "delta": {"stop_reason": reason, "stop_sequence": matched},
                    "usage": {"output_tokens": output_tokens},
                },
            )
        )
        await stream.write(sse("message_stop", {}))
        await stream.write_eof()
        return stream

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    return app


@asynccontextmanager
async def serving_anthropic(
    standin: AnthropicStandin, tls: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """Serve the stand-in on a free loopback port; yields its base URL (``https://`` with ``tls``)."""
    runner = web.AppRunner(build_app(standin), access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock, ssl_context=tls).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextmanager
def anthropic_in_thread(standin: AnthropicStandin, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """:func:`serving_anthropic` in a thread with an event loop of its own, for synchronous tests (a
    cluster's processes calling it); yields its base URL."""
    started = threading.Event()
    address: list[str] = []
    stopping: list[asyncio.Event] = []

    async def main() -> None:
        async with serving_anthropic(standin, tls) as url:
            address.append(url)
            stopping.append(asyncio.Event())
            started.set()
            await stopping[0].wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the Messages API stand-in did not start within 30 s")
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(30)
        loop.close()
