"""Asking a node for a shard's log lines, and its answers (``llmgw ctl logs``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogRequest:
    """A shard's last ``lines`` lines, then (``follow``) each new one until cancelled."""

    request_id: str
    replica_id: str = ""
    lines: int = 0
    follow: bool = False
    cancel: bool = False
    """Stop answering ``request_id``."""


@dataclass(frozen=True)
class LogLines:
    """Lines answering a :class:`LogRequest` (several answers while it follows)."""

    request_id: str
    lines: tuple[str, ...] = ()
    end: bool = False
    """Nothing more comes for this request."""
    error: str = ""
    """Why there are no lines (the node runs no such shard)."""
