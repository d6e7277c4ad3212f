"""Answers the gateway reshapes on their way to the client: one seam for the forwarding path.

Most answers pass through as the engine sent them. Where the client asked in
one API and the engine answers in another (a Responses request to an engine
that serves chat completions), or where llmgw keeps something of the answer
(a Response kept for ``previous_response_id``), the forwarding path is given
an :class:`AnswerShape`: it reshapes a whole answer, or gives an
:class:`EventShaper` that reshapes a stream's whole events as they come and
ends the stream in its own shape, including when the gateway must end it with
an error. Reshaping is awaited: what llmgw keeps of an answer is kept before
the bytes that end it are given back to be sent.
"""

from __future__ import annotations

from typing import Protocol

from llmgw.gateway.responses_api import ResponsesCall


class EventShaper(Protocol):
    """Reshapes one stream's events."""

    async def feed(self, events: bytes) -> bytes:
        """The client's bytes for a run of the engine's whole SSE events (may be empty)."""
        ...

    async def finish(self) -> bytes:
        """The client's last bytes once the engine's stream ended by itself."""
        ...

    def error(self, message: str, code: str) -> bytes:
        """The event that ends the stream when the gateway must (a failed replica, a limit)."""
        ...


class AnswerShape(Protocol):
    """How one request's answer is reshaped."""

    async def whole(self, body: bytes) -> bytes:
        """The client's body for the engine's successful whole answer."""
        ...

    def events(self) -> EventShaper:
        """A shaper for the engine's stream."""
        ...


class NativeResponses:
    """A Responses request an engine served itself: passed on, and kept for follow-ups."""

    def __init__(self, call: ResponsesCall) -> None:
        self.call = call

    async def whole(self, body: bytes) -> bytes:
        return await self.call.native_whole(body)

    def events(self) -> EventShaper:
        return self.call.native_events()


class TranslatedResponses:
    """A Responses request an engine answered as a chat completion: made into a Response."""

    def __init__(self, call: ResponsesCall) -> None:
        self.call = call

    async def whole(self, body: bytes) -> bytes:
        return await self.call.translated_whole(body)

    def events(self) -> EventShaper:
        return self.call.translated_events()
