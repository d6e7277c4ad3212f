"""Where the console's data comes from and where its actions go: one control plane's admin API.

:class:`ClusterSource` is the seam the app is built on; :class:`AdminSource`
is the real one, over the typed admin client (synchronous, so each call runs
in a worker thread) and the events client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from llmgw.adminapi.schemas import KeyCreated, ModelEntry, RestartAnswer, ServingView
from llmgw.client.admin import AdminClient
from llmgw.console.events import POLL_S, Event, EventsClient, Notice

T = TypeVar("T")


class ClusterSource(Protocol):
    name: str
    """What the title bar names: the control plane's URL."""

    def updates(self) -> AsyncIterator[Event | Notice]: ...

    async def fetch(self, kind: str) -> Any:
        """One kind's answer as its route gives it (``gpus``: the ``/metrics`` text)."""
        ...

    async def create_key(self, name: str, owner: str, place: str) -> KeyCreated: ...

    async def add_model(self, definition: dict[str, Any]) -> ModelEntry: ...

    async def set_serving(self, stopped: bool) -> ServingView: ...

    async def restart_agents(self, reason: str) -> RestartAnswer: ...


class AdminSource:
    """A control plane through :class:`~llmgw.client.admin.AdminClient` and ``/api/events``."""

    def __init__(self, client: AdminClient, *, poll_s: float = POLL_S) -> None:
        self.client = client
        self.name = client.url
        self.events = EventsClient(client.url, client.token, self.fetch, poll_s=poll_s)

    def updates(self) -> AsyncIterator[Event | Notice]:
        return self.events.updates()

    async def fetch(self, kind: str) -> Any:
        if kind == "gpus":
            text, _ = await self._run(self.client.text, "/metrics")
            return text
        if kind == "serving":  # no GET route of its own: /api/status says it
            return serving_of(await self._run(self.client.get, "/api/status"))
        return await self._run(self.client.get, _ROUTES[kind])

    async def create_key(self, name: str, owner: str, place: str) -> KeyCreated:
        return await self._run(self.client.create_key, name, owner, place)

    async def add_model(self, definition: dict[str, Any]) -> ModelEntry:
        return await self._run(self.client.add_model, definition)

    async def set_serving(self, stopped: bool) -> ServingView:
        return await self._run(self.client.set_serving, stopped)

    async def restart_agents(self, reason: str) -> RestartAnswer:
        return await self._run(self.client.restart_agents, reason)

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(call, *args)


_ROUTES = {
    "status": "/api/status",
    "nodes": "/api/nodes",
    "replicas": "/api/replicas",
    "models": "/api/models",
    "settings": "/api/settings",
    "keys": "/api/keys",
    "blobs": "/api/mirror/blobs",
    "history": "/api/settings-history?limit=50",
    "usage": "/api/usage?group_by=key&by=month",
    "training": "/api/training/jobs",
    "batches": "/api/batches",
}


def serving_of(status: Any) -> dict[str, Any]:
    """The ``serving`` kind as polling makes it: from ``/api/status`` (no GET route of its own)."""
    return {"stopped": bool(status.get("stopped", False))}
