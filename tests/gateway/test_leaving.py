"""A forwarded request learns that its client left: from the server's Departures, or from receive()."""

from __future__ import annotations

import asyncio
from typing import Any

from llmgw.gateway.exchange import Exchange
from llmgw.gateway.leaving import DEPARTURES, Departures, departures_of, watch
from llmgw.testing.eventually import eventually


def test_departures_call_each_callback_once_and_forget_discarded_ones() -> None:
    departures = Departures()
    called: list[str] = []

    def first() -> None:
        called.append("first")

    def second() -> None:
        called.append("second")

    departures.add(first)
    departures.add(second)
    departures.discard(second)
    departures.left()
    departures.left()
    assert called == ["first"] and len(departures) == 0


def test_a_callback_added_after_the_connection_is_lost_is_called_at_once() -> None:
    departures = Departures()
    departures.left()
    called: list[bool] = []
    departures.add(lambda: called.append(True))
    assert called == [True] and len(departures) == 0


def test_departures_are_read_from_the_scopes_extensions_only() -> None:
    departures = Departures()
    assert departures_of({"extensions": {DEPARTURES: departures}}) is departures
    assert departures_of({}) is None
    assert departures_of({"extensions": {DEPARTURES: "not them"}}) is None


async def _request(exchange: Exchange, receive: Any, release: asyncio.Event) -> str:
    task = asyncio.current_task()
    assert task is not None
    stop = watch(exchange, task, receive)
    try:
        await release.wait()
        return "answered"
    except asyncio.CancelledError:
        return "cancelled" if exchange.client_gone else "cancelled from outside"
    finally:
        exchange.finished = True
        stop()


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


async def test_the_servers_departures_cancel_the_request_with_no_task_of_its_own() -> None:
    departures = Departures()
    exchange = Exchange(b"r1")
    exchange.departures = departures
    running = asyncio.create_task(_request(exchange, _never, asyncio.Event()))
    await eventually(lambda: len(departures) == 1)
    departures.left()
    assert await running == "cancelled"


async def test_a_request_ended_before_its_client_left_is_forgotten_and_not_cancelled() -> None:
    departures = Departures()
    exchange = Exchange(b"r1")
    exchange.departures = departures
    release = asyncio.Event()
    release.set()
    assert await _request(exchange, _never, release) == "answered"
    assert len(departures) == 0
    departures.left()
    assert not exchange.client_gone


async def test_without_departures_a_disconnect_from_receive_cancels_the_request() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    exchange = Exchange(b"r1")
    running = asyncio.create_task(_request(exchange, messages.get, asyncio.Event()))
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    await messages.put({"type": "http.disconnect"})
    assert await asyncio.wait_for(running, 5) == "cancelled"


async def test_without_departures_the_watcher_ends_with_the_request() -> None:
    exchange = Exchange(b"r1")
    release = asyncio.Event()
    release.set()
    before = len(asyncio.all_tasks())
    assert await _request(exchange, _never, release) == "answered"
    await eventually(lambda: len(asyncio.all_tasks()) == before)  # the cancelled watcher's last step
    assert not exchange.client_gone
