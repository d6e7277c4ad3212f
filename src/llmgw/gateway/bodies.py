"""What a request brings: its body, read whole and bounded, and the one JSON parse of it.

The body is forwarded as the bytes received; it is parsed once, only to read
``model`` and ``stream``, and never encoded again.
"""

from __future__ import annotations

import json

from starlette.types import Receive

from llmgw.gateway.responses import ApiError


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


def model_and_stream(body: bytes) -> tuple[str, bool]:
    """The request's ``model`` and ``stream``: the one JSON parse the gateway does."""
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
    return model, data.get("stream") is True
