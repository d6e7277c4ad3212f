"""The events client: ``GET /api/events`` read as server-sent events, or polling where it is missing.

The stream sends ``event: <kind>`` and ``data: <json>`` lines, an empty line
ending each event, and ``: keepalive`` comments every 15 s; every kind comes
once on connect, then again whole on each change. A control plane older than
the stream answers 404: the console then asks each route itself every
:data:`POLL_S` seconds and says so on its status line. A stream that ends or
fails is opened again after a pause.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmgw.console.state import STREAMED
from llmgw.errors import LlmgwError

POLL_S = 5.0
"""How often an older control plane (no ``/api/events``) is asked for everything."""
RETRY_S = 2.0
"""The pause before the stream is opened again after it ended or failed."""


@dataclass(frozen=True)
class Event:
    kind: str
    data: Any


@dataclass(frozen=True)
class Notice:
    """A change in how the console hears of the cluster, for its status line."""

    text: str
    trouble: bool = False


def parse_events(lines: list[str]) -> tuple[list[Event], list[str]]:
    """The whole events in ``lines`` (text lines without their ends), and the lines of an unfinished one."""
    events: list[Event] = []
    kind, data, start = "message", list[str](), 0
    for number, line in enumerate(lines):
        if line == "":
            if data:
                events.append(Event(kind, json.loads("\n".join(data))))
            kind, data, start = "message", [], number + 1
        elif line.startswith(":"):
            continue  # a comment: the keepalive
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)
    return events, lines[start:]


class EventsClient:
    """The cluster's changes from one control plane, as events and notices."""

    def __init__(
        self,
        url: str,
        token: str,
        poll: Callable[[str], Awaitable[Any]],
        *,
        poll_s: float = POLL_S,
        retry_s: float = RETRY_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.poll = poll
        """Asks one route (by kind) for its answer: used where the stream is missing."""
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.sleep = sleep

    async def updates(self) -> AsyncIterator[Event | Notice]:
        """Events as they come, forever; notices when the way of hearing changes or fails."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            while True:
                try:
                    async with session.get(self.url + "/api/events") as response:
                        if response.status == 404:
                            break
                        if response.status != 200:
                            yield Notice(await _refusal(response), trouble=True)
                            await self.sleep(self.retry_s)
                            continue
                        yield Notice(f"live: events from {self.url}")
                        async for event in _read(response):
                            yield event
                    yield Notice(f"the events stream of {self.url} ended: opening it again", trouble=True)
                except (aiohttp.ClientError, OSError) as error:
                    yield Notice(f"cannot reach {self.url}: {error or type(error).__name__}", trouble=True)
                await self.sleep(self.retry_s)
        async for update in self._polling():
            yield update

    async def _polling(self) -> AsyncIterator[Event | Notice]:
        said = ""
        while True:
            text = f"polling every {self.poll_s:g} s: {self.url} has no /api/events (an older control plane)"
            try:
                events = [Event(kind, await self.poll(kind)) for kind in STREAMED]
            except LlmgwError as error:
                text, events = str(error), []
            if text != said:
                said = text
                yield Notice(text, trouble=not events)
            for event in events:
                yield event
            await self.sleep(self.poll_s)


async def _read(response: aiohttp.ClientResponse) -> AsyncIterator[Event]:
    pending: list[str] = []
    async for raw in response.content:
        pending.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        if pending[-1] == "":
            events, pending = parse_events(pending)
            for event in events:
                yield event


async def _refusal(response: aiohttp.ClientResponse) -> str:
    try:
        detail = (await response.json()).get("error", {})
    except (ValueError, aiohttp.ContentTypeError):
        detail = {}
    message = detail.get("message") or f"HTTP {response.status}"
    hint = detail.get("hint") or "check the URL and token ('llmgw ctl context list')"
    return f"the events stream refused: {message} ({hint})"
