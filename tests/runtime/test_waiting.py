"""wait_event: set, timed out, and cancelled as the event is set (the cancel is never lost)."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.runtime.waiting import wait_event, within


async def test_an_event_set_meanwhile_is_seen_and_one_never_set_times_out() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5)
    assert not await wait_event(asyncio.Event(), 0.01)
    assert await wait_event(event, 0)  # already set: no wait at all


async def _looping(event: asyncio.Event, waits: list[int]) -> None:
    while True:  # a long-running loop as the control plane's are written
        await wait_event(event, 10)
        event.clear()
        waits.append(1)


async def test_a_loop_cancelled_as_its_event_is_set_ends() -> None:
    """asyncio.wait_for (3.11) returns instead of raising when the cancel meets the event being set:
    the loop then waits 10 s more, and again, and whoever stops it waits for ever."""
    for _ in range(50):
        event, waits = asyncio.Event(), []
        task = asyncio.create_task(_looping(event, waits))
        await asyncio.sleep(0)  # the loop is waiting
        event.set()
        await asyncio.sleep(0)  # the inner wait completes...
        task.cancel()  # ...and the cancel arrives in the same turn
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done and task.cancelled()


async def test_within_answers_times_out_and_keeps_a_cancel_that_meets_the_answer() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    queue.put_nowait(1)
    assert await within(queue.get(), 1) == 1
    with pytest.raises(TimeoutError):
        await within(queue.get(), 0.01)

    got: list[int] = []

    async def draining() -> None:
        while True:
            got.append(await within(queue.get(), 10))

    for n in range(50):
        task = asyncio.create_task(draining())
        await asyncio.sleep(0)
        queue.put_nowait(n)
        await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done and task.cancelled()
    assert got == list(range(50))  # nothing taken and dropped
