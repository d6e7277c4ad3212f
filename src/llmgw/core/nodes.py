"""A node's session with the control plane: its registration, the answer, and the plain commands.

An agent opens each stream with a :class:`NodeRegistration` (what the node
has and which shards it runs); the control plane answers with
:class:`Registered` (who leads, every control plane to fall back to), and
later sends :class:`SettingsUpdate` and :class:`RestartAgent`. A registration
carries the :class:`SettingsRefusal` of settings the agent could not start on. Both sides send
:class:`Heartbeat`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmgw.core.devices import NodeInventory
from llmgw.core.shards import RunningShard


@dataclass(frozen=True)
class SettingsRefusal:
    """Settings the agent went back from: it could not start on them, and runs on the last good ones."""

    settings: str
    """The refused settings, as YAML."""
    reason: str
    """Why the agent could not start on them (``Type: message``)."""
    refused_at: float = 0.0
    """When the agent went back, as a Unix timestamp."""


def flat_settings(settings: Any, prefix: str = "") -> str:
    """Settings as ``work_dir=/x, shards.stop_grace_s=2`` (``none`` when empty)."""
    if not isinstance(settings, dict):
        return f"{prefix.rstrip('.')}={settings}" if prefix else str(settings)
    parts = [
        flat_settings(value, f"{prefix}{key}.") if isinstance(value, dict) else f"{prefix}{key}={value}"
        for key, value in sorted(settings.items())
    ]
    return ", ".join(parts) or "none"


@dataclass(frozen=True)
class NodeRegistration:
    """What an agent says first on each stream."""

    inventory: NodeInventory
    shards: tuple[RunningShard, ...] = ()
    """The shards the node runs now, adopted ones included."""
    engines: tuple[str, ...] = ()
    """Engines and versions the node can run, ``llama.cpp b11434 cpu``."""
    agent_version: str = ""
    refused_settings: SettingsRefusal | None = None
    """Settings from the control plane the agent could not start on (it runs on its last good ones)."""

    @property
    def node_id(self) -> str:
        return self.inventory.node_id


@dataclass(frozen=True)
class Registered:
    """The control plane's answer to a registration; sent again when the control planes change."""

    leader: str = ""
    """The leading control plane's name."""
    control_planes: tuple[str, ...] = ()
    """Every control plane's agent server address."""
    standby: bool = False
    """This control plane does not lead: connect to ``leader_address``."""
    leader_address: str = ""
    """The leader's agent server, empty while none leads."""


@dataclass(frozen=True)
class Heartbeat:
    """Keeps a quiet stream known to be alive."""

    sent_unix_ms: int = 0


@dataclass(frozen=True)
class SettingsUpdate:
    """The node's settings as YAML (``agents.default`` merged with ``agents.nodes.<id>``)."""

    yaml: str


@dataclass(frozen=True)
class RestartAgent:
    """Restart the agent (its engines keep running and are adopted)."""

    reason: str = ""
