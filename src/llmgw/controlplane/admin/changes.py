"""What changed, told where it happens: the one in-process publisher behind ``GET /api/events``.

The fleet (a node attaching or going, a replica's state), the reconciler (the
catalog loaded with something new, a model's placement verdict), and the admin
routes (settings, serving stopped or started, keys) call :meth:`Changes.changed`
with the kind of view that changed. Each subscriber (one per open event
stream) collects the kinds changed since it last looked; nothing is read from
the store to find out. A change of what ``/api/status`` counts (nodes,
replicas, models, serving) marks ``status`` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, get_args

Kind = Literal["nodes", "replicas", "models", "settings", "serving", "keys", "status"]
"""The kinds of view an event carries: each is what its GET route answers."""

KINDS: tuple[Kind, ...] = get_args(Kind)

ALSO: dict[Kind, tuple[Kind, ...]] = {
    "nodes": ("status",),
    "replicas": ("models", "status"),  # a model's view counts its replicas and those ready
    "models": ("status",),
    "serving": ("settings", "status"),  # serving.stopped is a setting
}
"""Views that show part of another: a change of the key changes these too."""


class Subscription:
    """One subscriber's kinds changed since it last took them."""

    def __init__(self) -> None:
        self._pending: set[Kind] = set()
        self._ready = asyncio.Event()
        self.closed = False
        """The publisher closed (the process stops): the stream ends."""

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def mark(self, kinds: tuple[Kind, ...]) -> None:
        self._pending.update(kinds)
        self._ready.set()

    @property
    def pending(self) -> frozenset[Kind]:
        return frozenset(self._pending)

    async def wait(self) -> None:
        """Return once some kind has changed since the last :meth:`take`."""
        await self._ready.wait()

    def take(self) -> list[Kind]:
        """The kinds changed since the last take (in :data:`KINDS` order), forgetting them."""
        taken = [kind for kind in KINDS if kind in self._pending]
        self._pending.clear()
        self._ready.clear()
        return taken


class Changes:
    """The publisher: :meth:`changed` marks a kind for every subscriber; :meth:`subscribe` adds one."""

    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()
        self._closed = False

    def close(self) -> None:
        """End every subscription, and any made from now on: the process stops, and an open stream
        would hold the HTTP server's graceful stop for ever."""
        self._closed = True
        for subscriber in self._subscribers:
            subscriber.close()

    def changed(self, *kinds: Kind) -> None:
        """``kinds`` changed (and the views that show them: :data:`ALSO`). Never blocks."""
        if not self._subscribers:
            return
        marked: list[Kind] = []
        for kind in kinds:
            marked += [kind, *ALSO.get(kind, ())]
        for subscriber in self._subscribers:
            subscriber.mark(tuple(marked))

    @property
    def subscribers(self) -> int:
        """How many subscriptions are open."""
        return len(self._subscribers)

    @contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        """A subscription for the block; it is dropped when the block ends, however it ends."""
        subscription = Subscription()
        if self._closed:
            subscription.close()
        self._subscribers.add(subscription)
        try:
            yield subscription
        finally:
            self._subscribers.discard(subscription)
