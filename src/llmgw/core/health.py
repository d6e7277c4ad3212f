"""What a process reports about its long-lived components (reconciler, load reader, sessions...).

A process supervisor (``llmgw.runtime.supervising``) keeps one
:class:`ComponentHealth` per component it runs; ``/api/status`` and
``llmgw ctl status`` show them, so a component that failed is never silent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ComponentState(enum.StrEnum):
    """Where a supervised component stands."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    """It failed and waits out its backoff before it runs again."""
    STOPPED = "stopped"
    FAILED = "failed"
    """It failed and is not restarted: the process ends."""


@dataclass(frozen=True)
class ComponentHealth:
    """One component's state, its restarts and its last error (empty if none yet)."""

    name: str
    state: ComponentState
    restarts: int = 0
    last_error: str = ""
    """The last failure's exception, as ``Type: message``."""
    last_error_at: float | None = None
    """When it failed last, as a Unix timestamp."""
