"""Sending each node its settings: on register, and a second after they change (C2.4).

A node's settings are ``agents.default`` with ``agents.nodes.<id>`` over it,
sent as YAML in a ``Settings`` message; the agent compares them with those it
runs and starts again on new ones. Changes within the delay go out together.

The settings are read all at once (one query) and kept until a change is told
(:meth:`SettingsPush.changed`, as the admin API does) or
:data:`SHARED_MAX_AGE_S` has passed: a new leader that a thousand nodes
register with reads them once, not three times for each node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import yaml

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.agentsettings import (
    DEFAULT_KEY,
    NODE_PREFIX,
    forbidden_keys,
    is_agent_key,
    key_problem,
    node_settings,
)
from llmgw.core.nodes import SettingsUpdate
from llmgw.core.settingtypes import FIREWALL_ENABLED
from llmgw.errors import ChannelClosed, LlmgwError
from llmgw.protocol.links import ControlLink
from llmgw.store.database import Store

log = logging.getLogger(__name__)

PUSH_DELAY_S = 1.0
SHARED_MAX_AGE_S = 5.0
"""How long the settings read are kept before they are read again (a change told reads them at once)."""

SettingsCheck = Callable[[Any], list[tuple[str, str]]]
"""Why a value cannot be an agent's settings, each key named (empty: it can)."""


def forbidden_only(value: Any) -> list[tuple[str, str]]:
    """The check without agent.yaml's schema: a mapping, without the node's own keys."""
    if not isinstance(value, dict):
        return [("value", "agents' settings are a mapping, like agent.yaml")]
    return [
        (key, "only the node's own agent.yaml may set this; remove it here") for key in forbidden_keys(value)
    ]


def setting_problems(key: str, value: Any, check_agents: SettingsCheck) -> list[tuple[str, str]]:
    """Why ``key`` cannot be set to ``value``: agents' keys checked as agent.yaml without its own keys."""
    if not key or len(key) > 200:
        return [("key", "a setting's key is 1 to 200 characters")]
    if not is_agent_key(key):
        return []
    problem = key_problem(key)
    if problem:
        return [("key", problem)]
    return check_agents(value)


class SettingsPush:
    """Sends nodes their settings."""

    def __init__(
        self,
        store: Store,
        fleet: Fleet,
        delay_s: float = PUSH_DELAY_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sleep = sleep
        self._clock = clock
        self._shared: tuple[float, asyncio.Task[dict[str, Any]]] | None = None
        """When the settings were read, and the read (awaited by every registration meanwhile)."""
        self.shared_reads = 0
        """Reads of the settings, for the tests."""
        self._store = store
        self._fleet = fleet
        self._delay_s = delay_s
        self._pending: asyncio.Task[None] | None = None
        self._dirty = False

    async def _read_shared(self) -> dict[str, Any]:
        self.shared_reads += 1
        return await self._store.settings.all()

    async def shared(self) -> dict[str, Any]:
        """Every setting by key, read at most once per :data:`SHARED_MAX_AGE_S` (or change told)."""
        kept = self._shared
        if (
            kept is None
            or self._clock() - kept[0] >= SHARED_MAX_AGE_S
            or (kept[1].done() and (kept[1].cancelled() or kept[1].exception() is not None))
        ):  # none yet, too old, or failed: read again
            kept = (self._clock(), asyncio.ensure_future(self._read_shared()))
            self._shared = kept
        return await asyncio.shield(kept[1])

    async def settings_of(self, node_id: str) -> str:
        stored = await self.shared()
        settings = node_settings(stored.get(DEFAULT_KEY, {}), stored.get(NODE_PREFIX + node_id, {}))
        firewall = stored.get(FIREWALL_ENABLED)
        if isinstance(firewall, bool):  # the cluster's firewall.enabled, over agents' own (C10.2)
            settings = node_settings(settings, {"firewall": {"enabled": firewall}})
        return yaml.safe_dump(settings, sort_keys=True)

    async def send(self, node_id: str, channel: ControlLink) -> None:
        """Send one node its settings (ChannelClosed when its stream has ended)."""
        text = await self.settings_of(node_id)
        await channel.send(SettingsUpdate(yaml=text))

    def changed(self) -> None:
        """Agents' settings changed: send every connected node its settings after the delay."""
        self._dirty = True
        self._shared = None  # read again
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._push_later(), name="settings-push")

    async def _push_later(self) -> None:
        while self._dirty:
            await self._sleep(self._delay_s)
            self._dirty = False  # what changed before now is read below; later changes push again
            for node_id, node in list(self._fleet.nodes.items()):
                try:
                    await self.send(node_id, node.channel)
                except (ChannelClosed, LlmgwError) as error:
                    log.warning("could not send node %s its settings: %s", node_id, error)

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        if self._shared is not None and not self._shared[1].done():
            self._shared[1].cancel()
