"""Chat completions to an Anthropic provider: the request as a Messages request, the answer back.

The Messages API (https://docs.anthropic.com/en/api/messages, ``anthropic-version:
2023-06-01``) takes ``system`` apart from the turns, content as blocks, a required
``max_tokens``, ``stop_sequences`` and tools with an ``input_schema``; it answers
a message of content blocks (``text``, ``tool_use``) with a ``stop_reason`` and
``usage.input_tokens`` / ``output_tokens``, or streams it as ``message_start``,
``content_block_start`` / ``_delta`` / ``_stop`` per block, ``message_delta``
(the stop reason and output tokens) and ``message_stop``.

:func:`messages_request` makes the Messages request of a chat completions body;
:class:`MessagesAnswer` reads the provider's answer as the chat completion (whole)
or chunks (streamed, with the usage chunk the gateway asks engines for and
``[DONE]``) the rest of the gateway relays. An error answer passes as it is:
its ``{"error": {"type", "message"}}`` is read as any engine's error is.
(The other direction, Anthropic clients calling llmgw, is ``gateway/messages_api.py``.)
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.upstream import UpstreamAnswer

MESSAGES_PATH = "/v1/messages"
DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` sent when the chat request sets none (the Messages API requires one)."""
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
"""Anthropic ``stop_reason`` -> chat ``finish_reason``."""


def _invalid(model: str, why: str) -> ApiError:
    return ApiError(
        400, f"Model '{model}' is served by an Anthropic provider: {why}", "invalid_request_error"
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _image(part: dict[str, Any]) -> dict[str, Any]:
    url = str((part.get("image_url") or {}).get("url", ""))
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[5:].partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            blocks.append(_image(part))
    return blocks


def _turn(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role == "tool":
        result = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id", ""))}
        return {"role": "user", "content": [{**result, "content": _text(message.get("content"))}]}
    blocks = _blocks(message.get("content"))
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict) or not isinstance(function := call.get("function") or {}, dict):
            continue
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return {"role": "assistant" if role == "assistant" else "user", "content": blocks}


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "tool", "name": str(choice["function"].get("name", ""))}
    return None


def messages_request(model: str, path: str, body: bytes, upstream: str) -> tuple[str, bytes, dict[str, Any]]:
    """The Messages route and body of a chat completions request for ``model`` (served by the
    provider's ``upstream``), and what reading the answer back needs (:class:`MessagesAnswer`)."""
    if path != "/v1/chat/completions":
        raise _invalid(model, f"it answers chat completions only, not {path}; use /v1/chat/completions")
    chat = json.loads(body)
    if not isinstance(chat, dict) or not isinstance(chat.get("messages", []), list):
        raise _invalid(model, "the body must be a JSON object with a list of messages")
    if chat.get("n") not in (None, 1):
        raise _invalid(model, "it gives one answer per request; remove n or set it to 1")
    messages = [m for m in chat.get("messages", ()) if isinstance(m, dict)]
    system = [_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    turns = [_turn(m) for m in messages if m.get("role") not in ("system", "developer")]
    request: dict[str, Any] = {
        "model": upstream,
        "messages": turns,
        "max_tokens": chat.get("max_completion_tokens") or chat.get("max_tokens") or DEFAULT_MAX_TOKENS,
    }
    if system:
        request["system"] = "\n\n".join(system)
    for name in ("temperature", "top_p"):
        if chat.get(name) is not None:
            request[name] = chat[name]
    stop = chat.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if isinstance(chat.get("tools"), list):
        request["tools"] = [
            {
                "name": f.get("name", ""),
                "description": f.get("description", ""),
                "input_schema": f.get("parameters") or {"type": "object", "properties": {}},
            }
            for t in chat["tools"]
            if isinstance(t, dict) and isinstance(f := t.get("function"), dict)
        ]
    if (choice := _tool_choice(chat.get("tool_choice"))) is not None:
        request["tool_choice"] = choice
    if chat.get("user"):
        request["metadata"] = {"user_id": str(chat["user"])}
    stream = bool(chat.get("stream"))
    if stream:
        request["stream"] = True
    shape = {"model": model, "stream": stream, "created": int(time.time())}
    return MESSAGES_PATH, json.dumps(request, separators=(",", ":")).encode(), shape


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    prompt = int(usage.get("input_tokens") or 0) + int(usage.get("cache_read_input_tokens") or 0)
    prompt += int(usage.get("cache_creation_input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_completion(message: dict[str, Any], model: str, created: int) -> dict[str, Any]:
    """A whole Messages answer as a chat completion."""
    text = "".join(b.get("text", "") for b in message.get("content", ()) if b.get("type") == "text")
    calls = [
        {
            "id": b.get("id", ""),
            "type": "function",
            "function": {"name": b.get("name", ""), "arguments": json.dumps(b.get("input") or {})},
        }
        for b in message.get("content", ())
        if b.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + str(message.get("id", "")),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": FINISH_REASONS.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": _usage(message.get("usage") or {}),
    }


class StreamReshaper:
    """Messages stream events in, chat completion chunks out (SSE ``data:`` lines)."""

    def __init__(self, model: str, created: int) -> None:
        self.model, self.created = model, created
        self.id = "chatcmpl-"
        self._pending = b""
        self._usage: dict[str, Any] = {}
        self._tools: dict[int, int] = {}
        """A content block's index -> its tool call's index."""
        self.ended = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    def feed(self, data: bytes) -> bytes:
        """The chunks of the events completed by ``data``."""
        self._pending += data.replace(b"\r\n", b"\n")
        *events, self._pending = self._pending.split(b"\n\n")
        return b"".join(self._event(event) for event in events)

    def _event(self, raw: bytes) -> bytes:
        payload = b"".join(line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:"))
        if not payload:
            return b""
        try:
            event = json.loads(payload)
        except ValueError:
            return b""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.id = "chatcmpl-" + str(message.get("id", ""))
            self._usage.update(message.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") != "tool_use":
                return b""
            call = self._tools[int(event.get("index", 0))] = len(self._tools)
            function = {"name": block.get("name", ""), "arguments": ""}
            return self._chunk(
                {
                    "tool_calls": [
                        {"index": call, "id": block.get("id", ""), "type": "function", "function": function}
                    ]
                }
            )
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return self._chunk({"content": delta.get("text", "")})
            if delta.get("type") == "input_json_delta":
                call = self._tools.get(int(event.get("index", 0)), 0)
                arguments = {"arguments": delta.get("partial_json", "")}
                return self._chunk({"tool_calls": [{"index": call, "function": arguments}]})
            return b""
        if kind == "message_delta":
            self._usage.update(event.get("usage") or {})
            reason = str((event.get("delta") or {}).get("stop_reason"))
            return self._chunk({}, FINISH_REASONS.get(reason, "stop"))
        if kind == "message_stop":
            return self._end()
        if kind == "error":
            error = event.get("error") or {}
            shaped = {
                "error": {
                    "message": error.get("message", "the provider failed"),
                    "type": error.get("type", "api_error"),
                    "code": None,
                }
            }
            self.ended = True
            return b"data: " + json.dumps(shaped).encode() + b"\n\ndata: [DONE]\n\n"
        return b""  # ping, content_block_stop

    def _end(self) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        usage = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": _usage(self._usage),
        }
        return b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"


class MessagesAnswer:
    """A provider's Messages answer read as a chat completion (an :class:`UpstreamAnswer`)."""

    def __init__(self, answer: UpstreamAnswer, shape: dict[str, Any]) -> None:
        self._answer = answer
        self._shape = shape
        self.status = answer.status
        ok = answer.status < 400
        self.content_type = (
            ("text/event-stream" if shape["stream"] else "application/json") if ok else (answer.content_type)
        )
        self.retry_after = getattr(answer, "retry_after", "")

    async def read(self) -> bytes:
        raw = await self._answer.read()
        if self.status >= 400:
            return raw
        if self._shape["stream"]:
            reshaper = StreamReshaper(self._shape["model"], self._shape["created"])
            return reshaper.feed(raw + b"\n\n")
        try:
            message = json.loads(raw)
        except ValueError:
            return raw
        return json.dumps(chat_completion(message, self._shape["model"], self._shape["created"])).encode()

    async def iter_any(self) -> AsyncIterator[bytes]:
        if self.status >= 400 or not self._shape["stream"]:
            yield await self.read()
            return
        reshaper = StreamReshaper(self._shape["model"], self._shape["created"])
        async for piece in self._answer.iter_any():
            if out := reshaper.feed(piece):
                yield out

    def release(self) -> None:
        self._answer.release()

    def close(self) -> None:
        self._answer.close()
