"""The admin API's shapes for upgrading agents (``/api/upgrades/agents``)."""

from __future__ import annotations

from pydantic import Field

from llmgw.adminapi.schemas import AnswerModel, RequestModel


class AgentUpgradeRequest(RequestModel):
    sums: str = Field(min_length=1, max_length=1 << 16)
    """The release's SHA256SUMS, as signed; every file it lists must be in the mirror."""
    signature: str = Field(min_length=1, max_length=1024)
    """The release's SHA256SUMS.sig (base64 of the raw ed25519 signature)."""
    nodes: list[str] | None = None
    """The nodes to upgrade, in this order (absent: every connected node, by name)."""


class RolloutView(AnswerModel):
    version: str
    nodes: list[str]
    """The nodes to upgrade, in order."""
    upgraded: list[str]
    """Those that run the version now."""
    current: str
    """The node upgrading now ("" between nodes and once finished)."""
    error: str
    """Why the rollout stopped ("" unless it did)."""
    finished: bool
