"""Requests' demand for models: the gateway tells it, the reconciler reads it.

Built before both (the gateway's ``on_demand``/``on_used`` hooks are its
methods; the reconciler is handed it), so neither needs the other to exist
first. It keeps, per model, when a request last wanted or used it — what the
idle timeout of an on-demand model is measured from — and wakes the reconciler
when a request waits for a model with no ready replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class ModelDemand:
    """When each model was last wanted; :attr:`woken` is set when one is wanted with none ready."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_used: dict[str, float] = {}
        """Model -> when a request last wanted or used it (the clock's seconds)."""
        self.woken = asyncio.Event()
        """Set when the reconciler should run a pass now; it clears it."""

    def want(self, model: str) -> None:
        """A request wants ``model`` and no replica is ready: keep (or start) one, now."""
        self.last_used[model] = self.clock()
        self.woken.set()

    def used(self, model: str) -> None:
        """A request ``model`` served has ended: it stays in use for its idle timeout."""
        self.last_used[model] = self.clock()
