"""Exponential backoff that starts again after a success, with optional jitter."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays of ``base * factor**n`` capped at ``cap``; :meth:`reset` after a success.

    With ``jitter`` (0 to 1), each delay is shortened by up to that fraction, drawn by ``draw``
    (in [0, 1)): a thousand clients that failed together do not all try again together.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 60.0
    attempts: int = 0
    jitter: float = 0.0
    draw: Callable[[], float] = field(default=random.random, repr=False)

    def next_delay(self) -> float:
        """The delay before the next try, counting this try."""
        delay = min(self.cap, self.base * self.factor**self.attempts)
        self.attempts += 1
        if self.jitter:
            delay *= 1.0 - min(1.0, self.jitter) * self.draw()
        return delay

    def reset(self) -> None:
        self.attempts = 0
