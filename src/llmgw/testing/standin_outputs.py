"""What a stand-in says when a request constrains it: JSON that fits a schema, and log probabilities.

The real engines decode under a grammar made from ``response_format`` and
return each token's log probability when asked; the stand-ins, which make up
their words, answer with the smallest JSON value that fits the schema and
with a made-up (but well-formed, and never positive) log probability per
token, so a client's code that reads them runs against a stand-in as it does
against the engine.
"""

from __future__ import annotations

import json
from typing import Any


def instance_of(schema: Any) -> Any:
    """The smallest value that fits a JSON schema (objects with their required properties)."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        wanted = schema.get("required", list(properties))
        return {name: instance_of(properties.get(name, {})) for name in wanted}
    return {"string": "tok", "integer": 0, "number": 0, "boolean": True, "array": []}.get(str(kind))


def constrained_text(body: dict[str, Any]) -> str | None:
    """The answer a chat request's ``response_format`` constrains it to; None when it does not."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        return json.dumps(instance_of((response_format.get("json_schema") or {}).get("schema")))
    if kind == "json_object":
        return "{}"
    return None


def logprobs_of(pieces: list[str], top: int) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object for generated ``pieces``, ``top`` alternatives each."""
    content = []
    for index, piece in enumerate(pieces):
        logprob = -0.1 * (index % 5 + 1)
        alternatives = [{"token": piece, "logprob": logprob, "bytes": list(piece.encode())}]
        alternatives += [
            {"token": f" alt{n}", "logprob": logprob - n - 1, "bytes": list(f" alt{n}".encode())}
            for n in range(max(0, top - 1))
        ]
        content.append(
            {"token": piece, "logprob": logprob, "bytes": list(piece.encode()), "top_logprobs": alternatives}
        )
    return {"content": content}
