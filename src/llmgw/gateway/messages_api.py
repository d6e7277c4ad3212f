"""Anthropic's Messages API (``POST /v1/messages``) made into chat completions, and back.

A Messages request is translated into a chat completions body
(:func:`chat_body`): ``system`` becomes the first message, text and image
blocks become OpenAI content parts, ``tool_use`` blocks become an assistant's
``tool_calls`` and ``tool_result`` blocks ``tool`` messages, ``tools`` become
functions and ``stop_sequences`` ``stop``; ``metadata`` is dropped. A chat
completion is made into Anthropic's ``message`` (:func:`message_object`); the stream is
messages_events.py, and the request on its way, messages_call.py.
Errors are written in Anthropic's shape (:func:`anthropic_error_body`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from llmgw.gateway.api_errors import ApiError

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "stream")
"""Fields a Messages request passes to the chat completion as they are."""

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
"""Chat ``finish_reason`` -> Anthropic ``stop_reason`` (``stop`` is end_turn or stop_sequence)."""

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
"""HTTP status -> Anthropic error type; any other 4xx is invalid_request_error, 5xx api_error."""


def invalid(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", "invalid_request_error", field)


def anthropic_error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(status: int, message: str) -> bytes:
    """``{"type":"error","error":{"type":...,"message":...}}`` for an answer of ``status``."""
    error = {"type": anthropic_error_type(status), "message": message}
    return json.dumps({"type": "error", "error": error}).encode()


def _text_of(blocks: Any, field: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise invalid(field, "must be a string or a list of text blocks.")
    texts = []
    for i, block in enumerate(blocks):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise invalid(f"{field}.{i}", 'must be a text block {"type": "text", "text": "..."}.')
        texts.append(block["text"])
    return "\n".join(texts)


def _image_part(block: dict[str, Any], field: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid(f"{field}.source", "an image block needs a source (base64 or url).")
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise invalid(f"{field}.source", "a base64 image needs media_type and data strings.")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise invalid(f"{field}.source.type", "must be base64 or url.")


def _tool_result_text(content: Any, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    raise invalid(f"{field}.content", "must be a string or a list of text blocks.")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list of messages.")
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        field = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise invalid(f"{field}.role", "must be user or assistant.")
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise invalid(f"{field}.content", "must be a string or a list of content blocks.")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            where = f"{field}.content.{j}"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image":
                parts.append(_image_part(block, where))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise invalid(where, "a tool_use block needs an id and a name.")
                arguments = json.dumps(block.get("input") or {})
                function = {"name": block["name"], "arguments": arguments}
                calls.append({"id": block["id"], "type": "function", "function": function})
            elif kind == "tool_result" and role == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise invalid(
                        f"{where}.tool_use_id", "a tool_result block needs the tool_use_id it answers."
                    )
                text = _tool_result_text(block.get("content"), where)
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
            else:
                raise invalid(
                    f"{where}.type",
                    f"{kind!r} is not served here in a {role} message; use text, image, "
                    "tool_use (assistant) or tool_result (user).",
                )
        chat.extend(results)
        if role == "assistant":
            text = "".join(p["text"] for p in parts if p["type"] == "text")
            entry: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                entry["tool_calls"] = calls
            chat.append(entry)
        elif parts:
            chat.append({"role": "user", "content": parts})
    return chat


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools", "must be a list of tools.")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid(f"tools.{i}.name", "every tool needs a name.")
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid("tool_choice.type", "must be auto, any, none or tool (with a name).")


def chat_body(data: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body a Messages request ``data`` asks for (400 naming a bad field)."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "is required: the name of a model (GET /v1/models lists them).")
    max_tokens = data.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise invalid("max_tokens", "is required: a positive integer.")
    messages = _messages(data.get("messages"))
    if data.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text_of(data["system"], "system")})
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    for field in SAMPLING_FIELDS:
        if data.get(field) is not None:
            body[field] = data[field]
    stops = data.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise invalid("stop_sequences", "must be a list of strings.")
        body["stop"] = stops
    if data.get("tools") is not None:
        body["tools"] = _tools(data["tools"])
    if data.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(data["tool_choice"])
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    return body


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def stop_reason(choice: dict[str, Any], stops: Sequence[str]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a chat ``choice``.

    ``stop_sequence`` is named when the engine says which stop string matched
    (vLLM's ``stop_reason``); otherwise a stop is ``end_turn``."""
    finish_reason = choice.get("finish_reason")
    if finish_reason in STOP_REASONS:
        return STOP_REASONS[finish_reason], None
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def tool_input(arguments: Any) -> Any:
    """A tool call's arguments, parsed (``{}`` for none; the text kept when it is not JSON)."""
    if not arguments:
        return {}
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return {"arguments": arguments}


def message_object(completion: dict[str, Any], model: str, stops: Sequence[str] = ()) -> dict[str, Any]:
    """Anthropic's ``message`` for a whole chat ``completion``."""
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    answer = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = answer.get("content") or ""
    if text:
        content.append({"type": "text", "text": text})
    for call in answer.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{secrets.token_hex(12)}",
                "name": function.get("name", ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    reason, sequence = stop_reason(choice, stops)
    usage = completion.get("usage") or {}
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


class AnthropicError(ApiError):
    """A gateway error on the Messages route, answered in Anthropic's error shape."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(
            error.status,
            error.message,
            error.code,
            error.param,
            hint=error.hint,
            retry_after=error.retry_after,
            headers=error.headers,
        )

    def body(self) -> bytes:
        message = f"{self.message} ({self.hint})" if self.hint else self.message
        return anthropic_error_body(self.status, message)


def api_key_header(headers: Sequence[tuple[bytes, bytes]], authorization: bytes | None) -> bytes | None:
    """The key as an ``Authorization`` value: ``x-api-key`` (Anthropic's header) or the Bearer sent."""
    for name, value in headers:
        if name == b"x-api-key":
            return authorization if authorization is not None else b"Bearer " + value
    return authorization
