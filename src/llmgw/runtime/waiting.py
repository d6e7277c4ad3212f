"""Waiting for an event with a time limit, without losing a cancel.

Python 3.11's ``asyncio.wait_for`` returns the awaited result, instead of
raising ``CancelledError``, when the task waiting is cancelled as the thing it
waits for completes: the cancel is lost. A loop that waits for an event with
``wait_for`` then keeps running when it is stopped, and whoever awaits its end
waits for ever (seen: a plane's gateway state follower, once its plane had
come to lead, could not be stopped). ``asyncio.timeout`` keeps the cancel;
every long-running loop waits through :func:`wait_event` or :func:`within`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed; True when it was set."""
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``await awaitable`` for at most ``timeout_s`` (``TimeoutError`` after), as ``asyncio.wait_for``
    does, but a cancel that meets its completion is kept (raised at the task's next wait)."""
    async with asyncio.timeout(max(0.0, timeout_s)):
        return await awaitable
