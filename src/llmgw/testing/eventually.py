"""Waiting in tests for something that other tasks or processes make true: one poll loop, written once.

::

    replica = await eventually(lambda: fleet.replicas.get("r1"), message="r1 is known")
    await eventually(engine.healthy, timeout_s=60)            # an async condition
    eventually_sync(lambda: cluster.leader() == "cp2", timeout_s=30, message="cp2 leads")

The condition is called until it returns something truthy, which is
returned. An exception of the ``ignoring`` kinds (by default any
:class:`Exception`, so a condition may also be a block of asserts) counts
as "not yet". When ``timeout_s`` passes, :class:`AssertionError` says what
was awaited, for how long, and the last value or exception seen (chained).

These wait on the real clock: they are for what runs on its own (tasks,
sockets, processes). Where time itself is what a test moves, use
:class:`llmgw.testing.clock.FakeClock` instead.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

TIMEOUT_S = 5.0
"""How long a condition gets by default."""
INTERVAL_S = 0.01
"""How long to wait between two calls of the condition by default."""


class _Attempts:
    """What the calls so far saw, and the failure to raise when time is up."""

    def __init__(self, condition: Callable[..., Any], timeout_s: float, message: str) -> None:
        self.what = message or f"{getattr(condition, '__qualname__', repr(condition))}() to turn true"
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.calls = 0
        self.last: Any = None
        self.error: BaseException | None = None

    def saw(self, value: Any = None, error: BaseException | None = None) -> None:
        self.calls += 1
        self.last, self.error = value, error

    def pause(self, interval_s: float) -> float | None:
        """Seconds to wait before the next call, or None when time is up."""
        left = self.deadline - time.monotonic()
        return None if left <= 0 else min(interval_s, left)

    def failure(self) -> AssertionError:
        seen = (
            f"last error: {type(self.error).__name__}: {self.error}"
            if self.error is not None
            else f"last value: {self.last!r}"
        )
        return AssertionError(
            f"waited {self.timeout_s:g} s for {self.what}, in vain ({self.calls} tries); {seen}"
        )


@overload
async def eventually(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
    message: str = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T],
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
    message: str = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
) -> T: ...


async def eventually(
    condition: Callable[[], Any],
    *,
    timeout_s: float = TIMEOUT_S,
    interval_s: float = INTERVAL_S,
    message: str = "",
    ignoring: tuple[type[BaseException], ...] = (Exception,),
) -> Any:
    """Call ``condition`` (sync or async) until it returns something truthy, and return that.

    ``message`` names what is awaited in the failure (the condition's name by
    default); exceptions of the ``ignoring`` kinds mean "not yet", others
    propagate at once.
    """
    attempts = _Attempts(condition, timeout_s, message)
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as error:
            attempts.saw(error=error)
        else:
            if value:
                return value
            attempts.saw(value)
        pause = attempts.pause(interval_s)
        if pause is None:
            raise attempts.failure() from attempts.error
        await asyncio.sleep(pause)


def eventually_sync(
    condition: Callable[[], T],
    *,
    timeout_s: float = TIMEOUT_S,
    interval_s: float = INTERVAL_S,
    message: str = "",
    ignoring: tuple[type[BaseException], ...] = (Exception,),
) -> T:
    """:func:`eventually` for a test with no event loop (it blocks the thread between calls)."""
    attempts = _Attempts(condition, timeout_s, message)
    while True:
        try:
            value = condition()
        except ignoring as error:
            attempts.saw(error=error)
        else:
            if value:
                return value
            attempts.saw(value)
        pause = attempts.pause(interval_s)
        if pause is None:
            raise attempts.failure() from attempts.error
        time.sleep(pause)
