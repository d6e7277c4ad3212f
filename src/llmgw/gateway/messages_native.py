"""A Messages request sent as one to an engine that serves Anthropic's Messages API itself.

llama-server (b11434) and vLLM answer ``POST /v1/messages`` themselves
(recorded: tests/engines/data/llamacpp-b11434-messages-*). Such a request goes
to them as the client sent it, and their answer comes back as they sent it,
but for two fields the client must see as it would from any other engine:
the message's ``model`` (an engine names its weights' file; the client asked
for the catalog's name) and its ``id`` (llama-server's start ``chatcmpl-``;
Anthropic's, and the gateway's for a translated answer, ``msg_``). In a
stream both are in ``message_start`` only; every other event passes as it
came. Usage is the engine's: ``input_tokens`` in ``message_start`` and the
final ``output_tokens`` in ``message_delta`` (the stream's framer keeps both).

A request that searched knowledge collections, or that the gateway must
otherwise change as a chat completion, is translated instead
(:class:`~llmgw.gateway.messages_call.MessagesCall`).
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.messages_api import message_id
from llmgw.gateway.messages_events import error_event

_START = b'"message_start"'


class NativeMessages:
    """The answer shape of a Messages request an engine served itself (whole or streamed)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.message_id = message_id()

    def _named(self, message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "id": self.message_id, "model": self.model}

    async def whole(self, body: bytes) -> bytes:
        try:
            message = json.loads(body)
        except ValueError as error:
            raise ApiError(502, "The engine's answer was not JSON; ask again.", "api_error") from error
        if not isinstance(message, dict):
            raise ApiError(502, "The engine's answer was not a message; ask again.", "api_error")
        return json.dumps(self._named(message), separators=(",", ":")).encode()

    def events(self) -> NativeMessageEvents:
        return NativeMessageEvents(self)


class NativeMessageEvents:
    """An engine's Messages stream, passed on with ``message_start`` naming the catalog's model."""

    def __init__(self, shape: NativeMessages) -> None:
        self._shape = shape
        self._started = False

    async def feed(self, events: bytes) -> bytes:
        if self._started or not events:
            return events
        if _START not in events:  # llama-server b11434 drops it when the first token is a piece of
            self._started = True  # a character (its recording: llamacpp-b11434-messages-stream-emoji)
            return self._made_start() + events
        out = []
        for event in events.split(b"\n\n"):
            if not self._started and _START in event:
                event = self._renamed(event)
            out.append(event)
        return b"\n\n".join(out)

    def _made_start(self) -> bytes:
        """The ``message_start`` an engine left out; its prompt's tokens are counted by the gateway."""
        message = self._shape._named(
            {"type": "message", "role": "assistant", "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        )  # fmt: skip
        payload = json.dumps({"type": "message_start", "message": message}, separators=(",", ":"))
        return f"event: message_start\ndata: {payload}\n\n".encode()

    def _renamed(self, event: bytes) -> bytes:
        lines = event.split(b"\n")
        for index, line in enumerate(lines):
            if line.startswith(b"data:"):
                try:
                    data = json.loads(line[5:])
                except ValueError:
                    return event
                if isinstance(data, dict) and isinstance(data.get("message"), dict):
                    data["message"] = self._shape._named(data["message"])
                    lines[index] = b"data: " + json.dumps(data, separators=(",", ":")).encode()
                    self._started = True
        return b"\n".join(lines)

    async def finish(self) -> bytes:
        return b""

    def error(self, message: str, code: str) -> bytes:
        return error_event(message, code)
