"""A clock that stands still until the test moves it; sleepers wake as it passes their deadline."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime


class FakeClock:
    """Implements :class:`llmgw.runtime.clock.Clock`; :meth:`advance` moves both times and wakes sleepers."""

    def __init__(self, monotonic: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self._monotonic = monotonic
        self._started = monotonic
        self._offset = wall - monotonic
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._monotonic

    def time(self) -> float:
        return self._monotonic + self._offset

    def elapsed(self) -> float:
        """Seconds this clock has moved: what a test adds to a clock it cannot move (the database's)."""
        return self._monotonic - self._started

    def utcnow(self) -> datetime:
        """The wall time as an aware UTC datetime: what a store that stamps records on this clock writes."""
        return datetime.fromtimestamp(self.time(), UTC)

    def __call__(self) -> float:
        """The monotonic time: a FakeClock also serves where a ``Callable[[], float]`` is taken."""
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._monotonic + seconds, next(self._order), waiter))
        await waiter

    @property
    def sleepers(self) -> int:
        """How many tasks sleep on this clock now."""
        return sum(1 for _, _, waiter in self._sleepers if not waiter.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking in order every sleeper whose deadline passes."""
        target = self._monotonic + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, waiter = heapq.heappop(self._sleepers)
            self._monotonic = max(self._monotonic, deadline)
            if not waiter.done():
                waiter.set_result(None)
                for _ in range(5):  # let the woken task run up to its next await
                    await asyncio.sleep(0)
        self._monotonic = target
        await asyncio.sleep(0)
