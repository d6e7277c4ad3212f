"""FakeClock: time that moves only when the test moves it, waking sleepers in order."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from llmgw.runtime.clock import Clock
from llmgw.testing.clock import FakeClock


def test_it_is_a_clock_and_a_callable_of_monotonic_time() -> None:
    clock: Clock = FakeClock(monotonic=50.0)

    assert isinstance(clock, FakeClock)
    assert clock() == clock.monotonic() == 50.0


async def test_advancing_moves_monotonic_wall_and_datetime_time_together() -> None:
    clock = FakeClock(monotonic=100.0, wall=1_700_000_000.0)

    await clock.advance(60)

    assert (clock.monotonic(), clock.time(), clock.elapsed()) == (160.0, 1_700_000_060.0, 60.0)
    assert clock.utcnow() == datetime(2023, 11, 14, 22, 14, 20, tzinfo=UTC)


async def test_sleepers_wake_in_deadline_order_only_once_time_passes_their_deadline() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("late", 5)), asyncio.create_task(sleeper("early", 2))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2

    await clock.advance(1.9)
    assert woke == []
    await clock.advance(3.1)
    await asyncio.gather(*tasks)

    assert woke == ["early", "late"]
    assert clock.sleepers == 0
