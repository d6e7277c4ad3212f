"""The events client: server-sent events as /api/events sends them, and polling where it answers 404."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from textual.widgets import DataTable

from llmgw.client.admin import AdminClient
from llmgw.console.app import ConsoleApp
from llmgw.console.events import Event, EventsClient, Notice, parse_events
from llmgw.console.source import AdminSource
from llmgw.console.state import STREAMED
from llmgw.testing.eventually import eventually

from .fixtures import STREAMED as DATA

TOKEN = "llmgw-admin-console-test"


def test_lines_split_into_events_skipping_keepalives_and_keeping_an_unfinished_one() -> None:
    lines = ["event: nodes", 'data: [{"id": "a"}]', "", ": keepalive", "", "event: status", 'data: {"x"']
    events, rest = parse_events(lines)
    assert events == [Event("nodes", [{"id": "a"}])]
    assert rest == ["event: status", 'data: {"x"']


def test_an_event_may_spread_its_data_over_lines() -> None:
    events, rest = parse_events(["event: settings", "data: {", 'data: "a": 1}', ""])
    assert events == [Event("settings", {"a": 1})] and rest == []


class FakeControlPlane:
    """/api/events in the format the control plane sends, or 404 as an older one answers."""

    def __init__(self, streams: bool) -> None:
        self.streams = streams
        self.changes: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.authorizations: list[str] = []

    async def events(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.append(request.headers.get("Authorization", ""))
        if not self.streams:
            return web.json_response({"error": {"message": "no route /api/events"}}, status=404)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for kind, data in DATA.items():
            await response.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
        await response.write(b": keepalive\n\n")
        while True:
            kind, data = await self.changes.get()
            await response.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())


@pytest.fixture
async def control_plane(request: pytest.FixtureRequest) -> AsyncIterator[tuple[FakeControlPlane, str]]:
    fake = FakeControlPlane(streams=request.param)
    app = web.Application()
    app.router.add_get("/api/events", fake.events)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _nothing_polled(kind: str) -> Any:
    raise AssertionError(f"{kind} polled while the stream works")


async def take(updates: AsyncIterator[Event | Notice], count: int) -> list[Event | Notice]:
    out = []
    async with asyncio.timeout(5):
        async for update in updates:
            out.append(update)
            if len(out) == count:
                return out
    return out


@pytest.mark.parametrize("control_plane", [True], indirect=True)
async def test_every_kind_arrives_on_connect_then_each_change(
    control_plane: tuple[FakeControlPlane, str],
) -> None:
    fake, url = control_plane
    updates = EventsClient(url, TOKEN, _nothing_polled).updates()
    first = await take(updates, 1 + len(STREAMED))
    assert first[0] == Notice(f"live: events from {url}")
    assert [(e.kind, e.data) for e in first[1:] if isinstance(e, Event)] == list(DATA.items())
    await fake.changes.put(("serving", {"stopped": True}))
    assert await take(updates, 1) == [Event("serving", {"stopped": True})]
    assert fake.authorizations == [f"Bearer {TOKEN}"]
    await updates.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("control_plane", [False], indirect=True)
async def test_an_older_control_plane_is_polled_every_few_seconds_and_the_status_line_says_so(
    control_plane: tuple[FakeControlPlane, str],
) -> None:
    _, url = control_plane
    asked: list[str] = []
    pauses: list[float] = []

    async def poll(kind: str) -> Any:
        asked.append(kind)
        return DATA[kind]

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    updates = EventsClient(url, TOKEN, poll, sleep=sleep).updates()
    first = await take(updates, 1 + 2 * len(STREAMED))
    assert first[0] == Notice(f"polling every 5 s: {url} has no /api/events (an older control plane)")
    assert [(e.kind, e.data) for e in first[1:] if isinstance(e, Event)] == list(DATA.items()) * 2
    assert asked == list(STREAMED) * 2
    assert pauses == [5.0]
    await updates.aclose()  # type: ignore[attr-defined]


async def test_a_control_plane_out_of_reach_is_said_and_tried_again() -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    updates = EventsClient("http://127.0.0.1:9", TOKEN, _nothing_polled, sleep=sleep).updates()
    notices = await take(updates, 2)
    assert all(
        isinstance(n, Notice) and n.trouble and "cannot reach http://127.0.0.1:9" in n.text for n in notices
    )
    assert pauses == [2.0]
    await updates.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("control_plane", [True], indirect=True)
async def test_the_console_shows_a_change_the_stream_sends(
    control_plane: tuple[FakeControlPlane, str],
) -> None:
    fake, url = control_plane
    app = ConsoleApp(AdminSource(AdminClient(url, TOKEN)))
    async with app.run_test(size=(160, 40)):
        await eventually(lambda: [n.id for n in app.data.nodes] == ["gpu1", "cpu1"])
        await fake.changes.put(("nodes", [DATA["nodes"][0] | {"connected": False}]))
        table = app.query_one("#nodes", DataTable)
        await eventually(lambda: table.row_count == 1 and str(table.get_row_at(0)[1]) == "AWAY")
        assert app.notice == Notice(f"live: events from {url}")
