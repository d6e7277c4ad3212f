"""The one clock seam: production reads the system's, tests move a fake one (``llmgw.testing.clock``)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals and deadlines, wall time for records, and sleeping on the former."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines, backoff)."""
        ...

    def time(self) -> float:
        """Seconds since the Unix epoch (what is recorded and shown)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's monotonic time."""
        ...


class SystemClock:
    """The machine's clocks and asyncio's sleep."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
