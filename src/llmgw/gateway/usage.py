"""Token usage: finding it in engines' answers, and the record the gateway reports.

Usage is read without decoding whole answers: the last ``"usage": {...}``
object is located with a byte search and only that object is parsed. For
streams, :class:`EventFramer` passes on complete SSE events only, so a usage
object is never split, and an error event can always be appended cleanly; it
also takes out the usage-only event (``"choices": []`` with ``usage``) when the
gateway, not the client, asked for it.

A stream that ends before the engine's usage (the client left, a budget cut it,
the replica failed) is counted from what was relayed: :func:`tokens_in` counts
one completion token per content event as the events pass (a few byte counts
per chunk), and the prompt's tokens are asked of the engine's tokenizer after
the answer ended (``forwarding.py``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_TIMINGS = re.compile(rb'"timings"\s*:\s*\{')
_DECODER = json.JSONDecoder()
_EVENT_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request's use of a replica, reported after its answer ended."""

    key_id: str
    model: str
    replica_id: str
    prompt_tokens: int
    """Tokens the engine counted in the prompt; for a stream that ended before the engine's usage,
    the engine's tokenizer's count (0 when it gave none); 0 for a request no replica took."""
    completion_tokens: int
    """Tokens generated, as the engine counted them; for a stream that ended before the engine's
    usage, the content events the client was sent (:func:`tokens_in`)."""
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
    cached_tokens: int = 0
    """Prompt tokens the engine found in its cache, where it says (0 where it does not)."""
    cost: float = 0.0
    """What the request cost at its model's price when it ended (0: the model has no price)."""

    @property
    def refused(self) -> int:
        """The status the gateway refused the request with, no replica having taken it (400 bad
        body, 404 unknown model, 429 limits, 503 no replica …); 0 for a request a replica took."""
        return 0 if self.replica_id else self.status


def tokens_in(events: bytes) -> int:
    """Generated tokens in a run of whole SSE events: one per content event.

    Chat streams: one per ``"delta"`` (the Responses API's ``output_text.delta`` too) less the
    deltas that carry no text: the first, naming the role (``"content":null`` on llama.cpp,
    ``"content":""`` on vLLM), and the empty one that says why the answer finished; completions:
    one per ``"text"`` that is not empty. On llama.cpp's and vLLM's streams each such event is one
    token, except that a character made of several tokens (an emoji is three on SmolLM2) arrives as
    one event, and the token that ends the answer sends none. Engines' compact JSON is assumed.
    """
    deltas = events.count(b'"delta"')
    if deltas:
        empty = events.count(b'"content":null') + events.count(b'"content":""') + events.count(b'"delta":{}')
        return max(0, deltas - empty)
    return events.count(b'"text"') - events.count(b'"text":""')


def find_usage(data: bytes) -> dict[str, Any] | None:
    """The last ``usage`` object in a JSON answer or in a run of SSE events, or None."""
    return _find_object(data, _USAGE)


def find_timings(data: bytes) -> dict[str, Any] | None:
    """The last ``timings`` object (llama.cpp's, beside its usage) in an answer or events, or None."""
    return _find_object(data, _TIMINGS) if b'"timings"' in data else None


def _find_object(data: bytes, name: re.Pattern[bytes]) -> dict[str, Any] | None:
    match = None
    for match in name.finditer(data):  # noqa: B007 - the last match is wanted
        pass
    if match is None:
        return None
    start = match.end() - 1
    try:
        value, _ = _DECODER.raw_decode(data[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def names_prompt(usage: dict[str, Any] | None) -> bool:
    """Whether an engine's usage counts the prompt (a Messages stream that lost its ``message_start``
    names only its output)."""
    return usage is not None and ("prompt_tokens" in usage or "input_tokens" in usage)


def token_counts(usage: dict[str, Any] | None) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) from an OpenAI ``usage`` object (or a Messages one: its
    prompt is its ``input_tokens`` and the ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` beside them, as llama-server and vLLM count them)."""
    if not usage:
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))  # the Responses API's names
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    prompt = prompt if isinstance(prompt, int) else 0
    if "prompt_tokens" not in usage:  # Anthropic's: input_tokens are those neither read nor written
        for cached in ("cache_read_input_tokens", "cache_creation_input_tokens"):  # to its cache
            count = usage.get(cached)
            if isinstance(count, int):
                prompt += count
    return prompt, completion if isinstance(completion, int) else 0


def cached_count(usage: dict[str, Any] | None, timings: dict[str, Any] | None = None) -> int:
    """Prompt tokens the engine found in its cache: OpenAI's ``usage.prompt_tokens_details.cached_tokens``
    (the Responses API's ``input_tokens_details``), else Anthropic's ``cache_read_input_tokens`` (a
    Messages answer), else llama.cpp's ``timings.cache_n``; else 0."""
    for details in ("prompt_tokens_details", "input_tokens_details"):
        part = (usage or {}).get(details)
        if isinstance(part, dict) and isinstance(cached := part.get("cached_tokens"), int):
            return max(0, cached)
    read = (usage or {}).get("cache_read_input_tokens")
    if isinstance(read, int) and not isinstance(read, bool):
        return max(0, read)
    cached = (timings or {}).get("cache_n")
    return max(0, cached) if isinstance(cached, int) and not isinstance(cached, bool) else 0


def whole_counts(body: bytes) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens of an answer sent whole."""
    usage = find_usage(body)
    return (*token_counts(usage), cached_count(usage, find_timings(body)))


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

    __slots__ = ("_pending", "_strip", "timings", "usage")

    def __init__(self, *, strip_usage_only: bool = False) -> None:
        self._pending = b""
        self._strip = strip_usage_only
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        """llama.cpp's ``timings`` of the event that carried the usage (its ``cache_n``)."""

    def counts(self) -> tuple[int, int, int]:
        """(prompt, completion, cached) tokens of the usage seen."""
        return (*token_counts(self.usage), cached_count(self.usage, self.timings))

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
            if usage is not None:  # merged: a Messages stream has input and output in two events
                self.usage = usage if self.usage is None else {**self.usage, **usage}
                self.timings = find_timings(out) or self.timings
                if self._strip:
                    out = without_usage_only_events(out)
        return out

    def flush(self) -> bytes:
        """Bytes left after the last complete event (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        if rest and b'"usage"' in rest:
            usage = find_usage(rest)
            if usage is not None:  # merged: a Messages stream has input and output in two events
                self.usage = usage if self.usage is None else {**self.usage, **usage}
                self.timings = find_timings(rest) or self.timings
                if self._strip:
                    rest = without_usage_only_events(rest)
        return rest

    @property
    def mid_event(self) -> bool:
        """True while part of an event has arrived and its end has not."""
        return bool(self._pending)
