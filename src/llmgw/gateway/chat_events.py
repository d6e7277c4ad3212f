"""Reading a chat completion stream's whole SSE events: their ``data:`` payloads and their chunks.

What a stream is reshaped into (Responses events, Anthropic's Messages events) starts from the same
reading of the engine's chat events: each payload, ``[DONE]`` where the engine ended, and the JSON
object of every other.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def data_lines(events: bytes) -> list[bytes]:
    """The ``data:`` payloads of whole SSE events, in order."""
    return [line[5:].strip() for line in events.splitlines() if line.startswith(b"data:")]


def chat_chunks(events: bytes) -> Iterator[dict[str, Any] | None]:
    """The chunks of a run of whole chat completion events, in order; None where ``[DONE]`` came (a
    payload that is not a JSON object is skipped)."""
    for payload in data_lines(events):
        if payload == b"[DONE]":
            yield None
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            yield chunk
