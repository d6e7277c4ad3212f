"""A chat completion's stream, as Anthropic's Messages stream events.

The events come in Anthropic's order: ``message_start`` and a ``ping``; for each content
block (text, then each tool call) ``content_block_start``, its
``content_block_delta`` events (``text_delta``, or ``input_json_delta`` for a
tool call's arguments) and ``content_block_stop``; then ``message_delta``
(``stop_reason``, ``usage.output_tokens``) and ``message_stop``. Each is sent
as SSE with an ``event:`` line naming its type.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmgw.gateway.chat_events import chat_chunks
from llmgw.gateway.messages_api import anthropic_error_type, stop_reason


def sse(kind: str, data: dict[str, Any]) -> bytes:
    """One SSE event: ``event: kind`` and its JSON ``data`` (which carries ``type: kind``)."""
    payload = json.dumps({"type": kind, **data}, separators=(",", ":"))
    return f"event: {kind}\ndata: {payload}\n\n".encode()


class ChatToMessageEvents:
    """Reshapes one chat completion stream into a Messages stream (an ``EventShaper``)."""

    def __init__(self, message_id: str, model: str, stops: Sequence[str]) -> None:
        self.message_id = message_id
        self.model = model
        self.stops = stops
        self._started = False
        self._finished = False
        self._block = -1
        """The index of the open content block; -1 when none is open."""
        self._open_kind = ""
        self._tools: dict[int, int] = {}
        """A chat tool call's index -> its content block's index."""
        self._choice: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return sse("message_start", {"message": message}) + sse("ping", {})  # as Anthropic's streams go

    def _close(self) -> bytes:
        if self._block < 0 or not self._open_kind:
            return b""
        self._open_kind = ""
        return sse("content_block_stop", {"index": self._block})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._block += 1
        self._open_kind = kind
        return out + sse("content_block_start", {"index": self._block, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        out = []
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open_kind != "text":
                out.append(self._open("text", {"type": "text", "text": ""}))
            out.append(
                sse(
                    "content_block_delta",
                    {"index": self._block, "delta": {"type": "text_delta", "text": text}},
                )
            )
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            position = call.get("index", 0)
            function = call.get("function") or {}
            if position not in self._tools:
                block: dict[str, Any] = {
                    "type": "tool_use",
                    "id": call.get("id") or "",
                    "name": function.get("name") or "",
                    "input": {},
                }
                out.append(self._open(f"tool{position}", block))
                self._tools[position] = self._block
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                delta_event = {"type": "input_json_delta", "partial_json": arguments}
                out.append(sse("content_block_delta", {"index": self._tools[position], "delta": delta_event}))
        return b"".join(out)

    async def feed(self, events: bytes) -> bytes:
        out = [self._start()]
        for chunk in chat_chunks(events):
            if chunk is None:
                out.append(await self.finish())
                continue
            if isinstance(chunk.get("usage"), dict):
                self._usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    if choice.get("finish_reason"):
                        self._choice = choice
                    out.append(self._delta(choice.get("delta") or {}))
        return b"".join(out)

    async def finish(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        reason, sequence = stop_reason(self._choice, self.stops)
        usage = {"output_tokens": int(self._usage.get("completion_tokens") or 0)}
        if self._usage.get("prompt_tokens") is not None:
            usage["input_tokens"] = int(self._usage["prompt_tokens"])
        delta = {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}
        return self._start() + self._close() + sse("message_delta", delta) + sse("message_stop", {})

    def error(self, message: str, code: str) -> bytes:
        return error_event(message, code)


def error_event(message: str, code: str) -> bytes:
    """Anthropic's ``error`` event, for a stream the gateway must end."""
    status = 429 if "limit" in code else 529 if code in ("overloaded", "no_capacity") else 500
    return sse("error", {"error": {"type": anthropic_error_type(status), "message": message}})
