"""What a request brings: its body, read whole and bounded, and the one JSON parse of it.

The body is forwarded as the bytes received; it is parsed once, only to read
``model``, ``stream`` and ``stream_options``, and never encoded again, with one
exception: a stream whose client did not ask for usage gets
``stream_options.include_usage`` added (:func:`asking_for_usage`), so that its
tokens are counted; the usage-only event this brings is taken out of the
answer before the client sees it. Where the client sent no ``stream_options``
that is a splice of bytes, not a new encoding. Likewise a request to a
llama.cpp model with LoRA adapters gets the ``lora`` field choosing its
adapter (:func:`choosing_lora`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from starlette.types import Receive

from llmgw.gateway.api_errors import ApiError

if TYPE_CHECKING:
    from llmgw.gateway.knowledge import Retrieved
    from llmgw.gateway.messages_call import MessagesCall
    from llmgw.gateway.responses_api import ResponsesCall


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is larger than the gateway accepts ({limit} bytes); send a smaller request.",
        "request_too_large",
    )


async def read_body(receive: Receive, length: bytes | None, limit: int) -> bytes | None:
    """The whole request body; None when the client went away first."""
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise _too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class RequestFacts(NamedTuple):
    """What the gateway reads from a request body."""

    model: str
    stream: bool
    usage_asked: bool
    """The client asked for a usage event in the stream (``stream_options.include_usage``)."""
    stream_options: Any
    """The ``stream_options`` sent; :data:`ABSENT` when there were none."""
    prompt: str = ""
    """The prompt as text (chat messages joined by role), for prefix routing; empty when none."""
    prompt_request: dict[str, Any] | None = None
    """``{"prompt": ...}`` or ``{"messages": ...}`` as sent, with what changes how the engine renders
    it (``tools``, ``chat_template_kwargs``, …: :data:`CHAT_RENDERING`), to ask the engine's /tokenize."""
    data: dict[str, Any] | None = None
    """The body as parsed."""
    responses: ResponsesCall | MessagesCall | None = None
    """A ``/v1/responses`` or ``/v1/messages`` request, ready for the engine (set by the gateway)."""
    knowledge: Retrieved | None = None
    """What the knowledge collections it searched brought (set by the gateway; None: it searched none)."""


ABSENT: Any = object()

_ASK_FOR_USAGE = b'"stream_options":{"include_usage":true},'


def asking_for_usage(body: bytes, facts: RequestFacts) -> bytes:
    """``body`` with ``stream_options.include_usage`` set; the other options are kept.

    Left as it is when ``stream_options`` is neither an object nor null: the
    engine then answers the client's own mistake.
    """
    options = facts.stream_options
    if options is ABSENT:
        start = len(body) - len(body.lstrip())
        if body[start : start + 1] == b"{":
            return body[: start + 1] + _ASK_FOR_USAGE + body[start + 1 :]
    elif options is not None and not isinstance(options, dict):
        return body
    data = json.loads(body)
    data["stream_options"] = {**(options or {}), "include_usage": True}
    return _encoded(data)


def choosing_lora(body: bytes, lora: bytes) -> bytes:
    """``body`` with its ``lora`` field set to the JSON ``lora`` (llama-server's per-request adapters).

    A splice of bytes when the client sent no ``lora`` of its own; else the field is replaced.
    """
    start = len(body) - len(body.lstrip())
    if b'"lora"' not in body and body[start : start + 1] == b"{":
        rest = body[start + 1 :]
        separator = b"" if rest.lstrip().startswith(b"}") else b","
        return body[: start + 1] + b'"lora":' + lora + separator + rest
    data = json.loads(body)
    data["lora"] = json.loads(lora)
    return _encoded(data)


def json_body(data: Any) -> bytes:
    """A body the gateway made (``data``) as the engine is sent it."""
    return _encoded(data)


def _encoded(data: Any) -> bytes:
    """``data`` as compact UTF-8 JSON; escaped to ASCII where it holds lone surrogates (which JSON
    allows as ``\\ud800`` escapes and UTF-8 cannot carry), as the client must have sent them."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def model_and_stream(body: bytes) -> RequestFacts:
    """The request's ``model``, ``stream`` and ``stream_options``: the one JSON parse the gateway does."""
    if not body or body.isspace():
        raise ApiError(400, "The request body is empty; send a JSON object with 'model'.", "invalid_json")
    try:
        data = json.loads(body)
    except ValueError as error:
        raise ApiError(
            400,
            f"The request body is not valid JSON ({error}); send a JSON object with 'model'.",
            "invalid_json",
        ) from None
    except RecursionError:
        raise ApiError(
            400,
            "The request body nests arrays or objects too deeply to read; send a flatter JSON object.",
            "invalid_json",
        ) from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(data), "a number"
        )
        raise ApiError(
            400, f"The request body is {kind}; send a JSON object with 'model'.", "invalid_request_body"
        )
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            400,
            "You must provide a model parameter: a name from GET /v1/models as the string 'model'.",
            "missing_model" if model is None else "invalid_model",
            "model",
        )
    stream = data.get("stream") is True
    options = data.get("stream_options", ABSENT)
    usage_asked = stream and isinstance(options, dict) and options.get("include_usage") is True
    prompt, prompt_request = _prompt_of(data)
    return RequestFacts(model, stream, usage_asked, options, prompt, prompt_request, data)


CHAT_RENDERING = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
)
"""A chat request's fields that change the prompt its engine renders from the messages (vLLM's
``TokenizeChatRequest`` takes each), sent on to /tokenize as the request gave them."""

COMPLETION_RENDERING = ("add_special_tokens",)
"""Likewise for a completion (vLLM's ``TokenizeCompletionRequest``)."""


def _prompt_of(data: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The prompt's text and the /tokenize request that gives its tokens (chat or completion).

    The /tokenize request carries what changes the rendering as the request gave it (tools,
    template arguments, the generation prompt), so that the tokens are those the engine computes.
    """
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return prompt, _rendering({"prompt": prompt}, data, COMPLETION_RENDERING)
    messages = data.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                return "", None
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"<|{message.get('role', '')}|> {content or ''}")
        return "\n".join(parts), _rendering({"messages": messages}, data, CHAT_RENDERING)
    return "", None


def _rendering(request: dict[str, Any], data: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    for name in fields:
        if name in data:
            request[name] = data[name]
    return request
