"""Exponential backoff that starts again after a success."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """Delays of ``base * factor**n`` capped at ``cap``; :meth:`reset` after a success."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 60.0
    attempts: int = 0

    def next_delay(self) -> float:
        """The delay before the next try, counting this try."""
        delay = min(self.cap, self.base * self.factor**self.attempts)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
