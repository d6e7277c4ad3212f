"""Answers in the shapes OpenAI clients expect, written straight to ASGI ``send``.

Every error the gateway gives is ``{"error": {"message", "type", "param",
"code"}}`` (plus ``hint``, what to do, where one is given); :func:`send_bytes`
sends every whole answer; :class:`ApiError` carries one from where it is found to where it is
sent, and :func:`normalise_engine_error` turns an engine's own error body
(llama-server, vLLM, SGLang, TensorRT-LLM, FastAPI, plain text) into it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

from llmgw.core.requestbounds import Refusal
from llmgw.errors import LlmgwError
from llmgw.gateway.engine_mistakes import client_mistake

JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None, hint: str = ""
) -> bytes:
    error: dict[str, str | None] = {"message": message, "type": type_, "param": param, "code": code}
    if hint:
        error["hint"] = hint
    return json.dumps({"error": error}, separators=(",", ":")).encode()


class ApiError(LlmgwError):
    """An answer to send instead of the normal one: an HTTP status and an OpenAI error."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        *,
        hint: str = "",
        retry_after: int | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message, hint)
        self.status = status
        self.code = code
        self.param = param
        self.retry_after = retry_after
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.message, error_type(self.status), self.code, self.param, self.hint)

    def header_list(self) -> list[tuple[bytes, bytes]]:
        headers = list(self.headers)
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        return headers


def refused(refusal: Refusal) -> ApiError:
    """400 for a body outside what the model takes (:func:`~llmgw.core.requestbounds.check_request`)."""
    return ApiError(
        400,
        refusal.message,
        refusal.code,
        refusal.param,
        hint="change that field and send the request again",
    )


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes = JSON,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a whole answer in one body message: the one place a whole response is written."""
    out = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id),
    ]
    if headers:
        out.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, error: ApiError, request_id: bytes) -> None:
    await send_bytes(send, error.status, error.body(), request_id, headers=error.header_list())


def sse_error_event(message: str, code: str, type_: str = "server_error") -> bytes:
    """An SSE event carrying an OpenAI error, as OpenAI's SDKs raise it mid-stream."""
    return b"data: " + error_body(message, type_, code) + b"\n\n"


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value:
        # FastAPI's validation errors: [{"loc": [...], "msg": "..."}].
        parts = []
        for item in value:
            if isinstance(item, dict) and "msg" in item:
                where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                parts.append(f"{where}: {item['msg']}" if where else str(item["msg"]))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return None


def normalise_engine_error(status: int, body: bytes) -> tuple[int, bytes]:
    """An engine's error answer in OpenAI's shape, keeping its message, type, param and code; and
    the status to answer with.

    An answer to the client's own mistake (:func:`client_mistake`: llama.cpp answers some with 500)
    becomes 400 with llmgw's message; any other keeps the engine's status and words.
    """
    try:
        data: Any = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        data = None
    fields: dict[str, Any] = {}
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict):
            fields = inner
        elif isinstance(inner, str):
            fields = {"message": inner, **{k: data[k] for k in ("type", "param", "code") if k in data}}
        else:
            fields = data
    message = _text(fields.get("message")) or _text(fields.get("detail"))
    type_ = fields.get("type")
    param = fields.get("param")
    code = fields.get("code")
    hint = ""
    if message is not None and status < 502 and (mistake := client_mistake(message)) is not None:
        told = CONTEXT_HINT if mistake[1] == CONTEXT_EXCEEDED else ""
        return 400, error_body(mistake[0], "invalid_request_error", mistake[1], None, told)
    if message is not None and status < 502 and is_context_exceeded(type_, message):
        message, hint = _context_exceeded(message, fields)
        status, type_, code = 400, "invalid_request_error", CONTEXT_EXCEEDED
    if message is None:
        text = body.decode("utf-8", "replace").strip()
        message = text[:2000] if text else f"The replica answered HTTP {status} without a message."
    return status, error_body(
        message,
        type_ if isinstance(type_, str) and type_ else error_type(status),
        code if isinstance(code, str) and code else None,
        param if isinstance(param, str) and param else None,
        hint,
    )


CONTEXT_EXCEEDED = "context_length_exceeded"
"""OpenAI's code for a request longer than the model's context."""

CONTEXT_HINT = (
    "send a shorter prompt or a smaller max_tokens; or have an operator raise the model's ctx_size, "
    "the context of one request in tokens on every engine (llama.cpp is started with ctx_size x "
    "parallel): 'llmgw ctl model remove NAME', then 'llmgw ctl model add' with a larger --ctx-size"
)

_CONTEXT_WORDS = ("context length", "context size", "max_seq_len", "context window")


def is_context_exceeded(type_: Any, message: str) -> bool:
    """The engine refused a request longer than its context: llama-server's ``exceed_context_size_error``,
    vLLM's "maximum context length", SGLang's "longer than the model's context length"."""
    if type_ == "exceed_context_size_error":
        return True
    lowered = message.lower()
    return any(words in lowered for words in _CONTEXT_WORDS)


def _context_exceeded(message: str, fields: dict[str, Any]) -> tuple[str, str]:
    prompt, context = fields.get("n_prompt_tokens"), fields.get("n_ctx")  # llama-server's, n_ctx a slot's
    told = []
    if isinstance(prompt, int) and f"{prompt} tokens" not in message:
        told.append(f"the prompt is {prompt} tokens")
    if isinstance(context, int):
        told.append(f"the context of one request, the model's ctx_size, is {context} tokens")
    return (f"{message.rstrip('.')}: {'; '.join(told)}" if told else message), CONTEXT_HINT


def request_timed_out(model: str, limit: float | None) -> ApiError:
    """504 for a request its engine took longer on than its model's ``request_timeout_s`` (``limit``)."""
    took = f" ({limit:g} s)" if limit else ""
    return ApiError(
        504,
        f"The request ran past the time limit of model '{model}' on its engine{took} and was "
        "stopped; ask for fewer tokens (max_tokens), or have an operator raise request_timeout_s "
        "in the model's profile (provider.timeouts.total_s for a model served by a provider).",
        "request_timeout",
    )


def allow_only(method: str, path: str, *allowed: str) -> None:
    """405 naming the methods ``path`` takes, unless ``method`` is one of them."""
    if method not in allowed:
        raise ApiError(
            405,
            f"{method} is not allowed on {path}; use {' or '.join(allowed)}.",
            headers=((b"allow", ", ".join(allowed).encode()),),
        )
