"""Token usage: finding it in engines' answers, and the record the gateway reports.

Usage is read without decoding whole answers: the last ``"usage": {...}``
object is located with a byte search and only that object is parsed. For
streams, :class:`EventFramer` passes on complete SSE events only, so a usage
object is never split, and an error event can always be appended cleanly; it
also takes out the usage-only event (``"choices": []`` with ``usage``) when the
gateway, not the client, asked for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_DECODER = json.JSONDecoder()
_EVENT_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request's use of a replica, reported after its answer ended."""

    key_id: str
    model: str
    replica_id: str
    prompt_tokens: int
    """Tokens the engine counted in the prompt; 0 when the engine reported no usage."""
    completion_tokens: int
    """Tokens generated; 0 when the engine reported no usage (a stream without
    ``stream_options.include_usage`` on engines that only then report it)."""
    status: int
    """The HTTP status answered; 499 when the client went away, 502 when the replica failed mid-answer."""
    duration_s: float
    place: str = ""
    """Where the key sat when the request came (its project, or its user; empty: nowhere), as text."""
    ttft_s: float | None = None
    """Time to first token: from the request's arrival to the first event relayed to the client, as
    ``llmgw_gateway_time_to_first_token_seconds`` measures it; None for an answer sent whole."""
    generation_s: float = 0.0
    """Time spent generating the completion: a stream's time after its first event; an answer sent
    whole, its whole duration (the prompt's processing included)."""


def find_usage(data: bytes) -> dict[str, Any] | None:
    """The last ``usage`` object in a JSON answer or in a run of SSE events, or None."""
    match = None
    for match in _USAGE.finditer(data):  # noqa: B007 - the last match is wanted
        pass
    if match is None:
        return None
    start = match.end() - 1
    try:
        value, _ = _DECODER.raw_decode(data[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def token_counts(usage: dict[str, Any] | None) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) from an OpenAI ``usage`` object."""
    if not usage:
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))  # the Responses API's names
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return (
        prompt if isinstance(prompt, int) else 0,
        completion if isinstance(completion, int) else 0,
    )


def _boundary(data: bytes) -> int:
    """Index just past the last event terminator (a blank line) in ``data``; 0 when none."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _usage_only(event: bytes) -> bool:
    """True for an event whose data is a chunk with no choices and a usage object."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                value = json.loads(line[5:])
            except ValueError:
                return False
            return isinstance(value, dict) and value.get("choices") == [] and "usage" in value
    return False


def without_usage_only_events(data: bytes) -> bytes:
    """``data`` (whole SSE events, maybe an unterminated last one) less its usage-only events."""
    kept: list[bytes] = []
    start = 0
    dropped = False
    for end in _EVENT_END.finditer(data):
        event = data[start : end.end()]
        if b'"usage"' in event and _usage_only(event):
            dropped = True
        else:
            kept.append(event)
        start = end.end()
    rest = data[start:]
    if rest and b'"usage"' in rest and _usage_only(rest):
        dropped, rest = True, b""
    if not dropped:
        return data
    kept.append(rest)
    return b"".join(kept)


class EventFramer:
    """Splits an SSE byte stream at event boundaries and keeps the last usage seen.

    With ``strip_usage_only`` the usage-only event is read, then left out.
    """

    __slots__ = ("_pending", "_strip", "usage")

    def __init__(self, *, strip_usage_only: bool = False) -> None:
        self._pending = b""
        self._strip = strip_usage_only
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """The complete events ``chunk`` finishes (possibly ``b""``); the rest waits for more bytes."""
        data = self._pending + chunk if self._pending else chunk
        if data.endswith(b"\n\n"):
            cut = len(data)
        else:
            cut = _boundary(data)
        if cut == 0:
            self._pending = data
            return b""
        out, self._pending = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
        if b'"usage"' in out:
            usage = find_usage(out)
            if usage is not None:
                self.usage = usage
                if self._strip:
                    out = without_usage_only_events(out)
        return out

    def flush(self) -> bytes:
        """Bytes left after the last complete event (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        if rest and b'"usage"' in rest:
            usage = find_usage(rest)
            if usage is not None:
                self.usage = usage
                if self._strip:
                    rest = without_usage_only_events(rest)
        return rest

    @property
    def mid_event(self) -> bool:
        """True while part of an event has arrived and its end has not."""
        return bool(self._pending)
