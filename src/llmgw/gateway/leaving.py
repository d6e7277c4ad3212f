"""The client leaving: how a forwarded request learns that its client hung up, and stops.

A request's client may close its connection while the gateway waits for a
replica or relays its answer; the request is then cancelled (the replica's
connection is dropped, which frees its slot) and counted as 499. Two ways to
learn it:

- the HTTP server tells: llmgw's own server puts the connection's
  :class:`Departures` in the scope's extensions under :data:`DEPARTURES`, and
  calls it when the connection is lost. A request adds a callback and takes
  it out when done: a dictionary entry, no task.
- any other ASGI server (or an in-process call): a task waits on ``receive()``
  for ``http.disconnect``, as ASGI has it.

Invariants: the callback cancels the request's task at most once, never after
:attr:`~llmgw.gateway.exchange.Exchange.finished` (from then on a disconnect
changes nothing), and what :func:`watch` returns is called exactly once, when
the request ends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from starlette.types import Receive

DEPARTURES = "llmgw.departures"
"""The scope extension naming the connection's :class:`Departures` (llmgw's HTTP server sets it)."""


class Departures:
    """One client connection's callbacks for the moment it is lost; the server calls :meth:`left`."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self._callbacks: dict[Callable[[], None], None] = {}
        self.gone = False
        """The connection is lost: a callback added now is called at once."""

    def add(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the connection is lost (at once, if it is)."""
        if self.gone:
            callback()
        else:
            self._callbacks[callback] = None

    def discard(self, callback: Callable[[], None]) -> None:
        """Forget ``callback`` (its request ended)."""
        self._callbacks.pop(callback, None)

    def left(self) -> None:
        """The connection is lost: call every callback still added, once."""
        self.gone = True
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks:
            callback()

    def __len__(self) -> int:
        return len(self._callbacks)


class Watched(Protocol):
    """What :func:`watch` reads and writes of a request (an :class:`~llmgw.gateway.exchange.Exchange`)."""

    finished: bool
    client_gone: bool
    departures: Departures | None


def departures_of(scope: Mapping[str, Any]) -> Departures | None:
    """The connection's :class:`Departures`, where the server gave them (None: watch ``receive``)."""
    extensions = scope.get("extensions")
    if extensions is None:
        return None
    found = extensions.get(DEPARTURES)
    return found if isinstance(found, Departures) else None


def watch(exchange: Watched, task: asyncio.Task[Any], receive: Receive) -> Callable[[], None]:
    """Cancel ``task`` when the client of ``exchange`` leaves before it finished; returns what stops
    the watching (call it once the request ended)."""
    left = functools.partial(_client_left, exchange, task)
    departures = exchange.departures
    if departures is not None:
        departures.add(left)
        return functools.partial(departures.discard, left)
    watcher = asyncio.get_running_loop().create_task(_wait_for_disconnect(receive))
    watcher.add_done_callback(functools.partial(_disconnect_came, left))
    return functools.partial(_stop, watcher)


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _stop(watcher: asyncio.Task[None]) -> None:
    watcher.cancel()


def _disconnect_came(left: Callable[[], None], watcher: asyncio.Task[None]) -> None:
    if not watcher.cancelled() and watcher.exception() is None:
        left()


def _client_left(exchange: Watched, task: asyncio.Task[Any]) -> None:
    if exchange.finished or exchange.client_gone:
        return
    exchange.client_gone = True
    task.cancel()
