"""The sources of a request that searched knowledge collections, carried by its answer.

A whole answer gets a top-level ``sources`` array; a stream gets it in its
first event's JSON object (a chat stream's first chunk, a Responses stream's
``response.created``). Either way it is an extension field: the ``openai`` SDK
keeps it in the parsed object's ``model_extra``. It is spliced in as bytes
after the answer's shaping (a Responses request translated for a chat engine
is made into a Response first), so the rest of the answer is as it would be.
"""

from __future__ import annotations

from llmgw.gateway.api_errors import sse_error_event
from llmgw.gateway.shaping import AnswerShape, EventShaper


def with_sources(document: bytes, sources: bytes) -> bytes | None:
    """The JSON object ``document`` with ``sources`` as its first field; None when it is no object."""
    start = len(document) - len(document.lstrip())
    if document[start : start + 1] != b"{":
        return None
    rest = document[start + 1 :]
    separator = b"" if rest.lstrip().startswith(b"}") else b","
    return document[: start + 1] + b'"sources":' + sources + separator + rest


def _first_data_object(events: bytes, sources: bytes) -> bytes | None:
    """``events`` with ``sources`` put into the first ``data:`` line holding a JSON object, or None."""
    at = 0
    while (found := events.find(b"data:", at)) != -1:
        if found == 0 or events[found - 1 : found] == b"\n":
            start = found + 5
            while events[start : start + 1] == b" ":
                start += 1
            if events[start : start + 1] == b"{":
                return events[:start] + b'{"sources":' + sources + b"," + events[start + 1 :]
        at = found + 5
    return None


class SourcesEvents:
    """A stream's events (shaped by ``inner`` first, if any) with ``sources`` in its first object."""

    def __init__(self, inner: EventShaper | None, sources: bytes) -> None:
        self.inner = inner
        self.sources = sources
        self.sent = False

    async def feed(self, events: bytes) -> bytes:
        out = await self.inner.feed(events) if self.inner is not None else events
        if not self.sent and out:
            added = _first_data_object(out, self.sources)
            if added is not None:
                self.sent = True
                return added
        return out

    async def finish(self) -> bytes:
        return await self.inner.finish() if self.inner is not None else b""

    def error(self, message: str, code: str) -> bytes:
        if self.inner is not None:
            return self.inner.error(message, code)
        return sse_error_event(message, code)


class SourcesShape:
    """An answer (reshaped by ``inner`` first, if any) carrying ``sources``."""

    def __init__(self, inner: AnswerShape | None, sources: bytes) -> None:
        self.inner = inner
        self.sources = sources

    async def whole(self, body: bytes) -> bytes:
        if self.inner is not None:
            body = await self.inner.whole(body)
        return with_sources(body, self.sources) or body

    def events(self) -> EventShaper:
        return SourcesEvents(self.inner.events() if self.inner is not None else None, self.sources)
