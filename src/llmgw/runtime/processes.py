"""Running one process: built once, served until told to stop, stopped in order, closed in reverse.

Every llmgw process (the control plane, a gateway worker, the agent) is two
functions handed to :func:`run_process`:

- ``build(process)`` builds the process's parts once each, in dependency
  order, and returns them (a frozen dataclass): every part is handed what it
  needs when it is built, and what must be closed is pushed on
  :attr:`Process.closing`;
- ``serve(parts, process)`` registers the long-lived components on
  :attr:`Process.supervisor`, waits for :attr:`Process.stop` (or whatever
  else ends that process), makes its orderly stop and returns.

:func:`run_process` owns what every process shares:

- the stop signals (:data:`STOP_SIGNALS`: SIGINT, SIGTERM, SIGHUP) set
  :attr:`Process.stop`, whatever the process inherited (started where SIGINT
  is ignored, as a background job of a non-interactive shell is, a Ctrl-C
  still stops it); the handlers are removed when the run ends;
- the supervisor runs beside ``serve``; once ``serve`` returns, the
  supervisor stops every component left; when a FATAL component fails
  first, ``serve`` is cancelled;
- the error worth showing: the FATAL component's
  :class:`~llmgw.runtime.supervising.ComponentFailed` before any other, else
  the first error raised, never the exception group around it;
- the exit stack: whatever ``build`` pushed is closed in reverse once both
  have ended, whether the run ended cleanly, failed or was cancelled (a
  ``build`` that fails closes what it had built by then).

A process that is no asyncio loop (``llmgw up`` waits on its children)
takes the same signals with :func:`interrupt_on_signals`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TypeVar

from llmgw.runtime.supervising import ComponentFailed, Supervisor

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals every process stops on."""

P = TypeVar("P")


@dataclass(frozen=True)
class Process:
    """What the runner gives a process: its supervisor, its exit stack and its stop."""

    supervisor: Supervisor = field(default_factory=Supervisor)
    """Every long-lived component of the process (its health is what the process reports)."""
    closing: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    """What ``build`` opened, closed in reverse when the run ends."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by a stop signal (or by whoever started the process, in a test)."""


async def run_process(
    build: Callable[[Process], Awaitable[P]],
    serve: Callable[[P, Process], Awaitable[None]],
    process: Process | None = None,
    signals: Sequence[int] = STOP_SIGNALS,
) -> P:
    """Build the parts, serve them beside the supervisor until ``serve`` returns, close everything;
    the parts built are returned (what the run ended with: a restart asked for, say).

    ``process``: one made by the caller (to hold its supervisor, or to set its stop); ``signals``:
    those that set its stop (none: the caller stops it)."""
    process = process if process is not None else Process()
    with _stopping_on(signals, process.stop):
        async with process.closing:
            parts = await build(process)
            await _serve(serve(parts, process), process.supervisor)
    return parts


async def _serve(serving: Awaitable[None], supervisor: Supervisor) -> None:
    """Run ``serving`` beside ``supervisor``; the error worth showing, alone, if either fails."""
    try:
        async with asyncio.TaskGroup() as tasks:
            supervising = tasks.create_task(supervisor.run(), name="supervisor")
            served = tasks.create_task(_then(serving, supervisor.shutdown), name="serve")
            await asyncio.wait({supervising, served}, return_when=asyncio.FIRST_COMPLETED)
            if supervising.done():
                served.cancel()
    except BaseExceptionGroup as group:
        raise shown(group) from None


async def _then(serving: Awaitable[None], after: Callable[[], None]) -> None:
    try:
        await serving
    finally:
        after()


def shown(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error of ``group`` worth showing: a FATAL component's failure first, else the first
    error that is not a cancellation (groups within groups searched in order)."""
    errors = list(_leaves(group))
    for error in errors:
        if isinstance(error, ComponentFailed):
            return error
    for error in errors:
        if not isinstance(error, asyncio.CancelledError):
            return error
    return errors[0]


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


@contextlib.contextmanager
def _stopping_on(signals: Sequence[int], stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    try:
        for signum in signals:
            loop.add_signal_handler(signum, _stop_on, signum, stop)
            installed.append(signum)
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _stop_on(signum: int, stop: asyncio.Event) -> None:
    if not stop.is_set():
        log.info("%s: stopping", signal.Signals(signum).name)
    stop.set()


def interrupt_on_signals(signals: Sequence[int] = STOP_SIGNALS) -> None:
    """For a process that runs no asyncio loop: each of ``signals`` raises KeyboardInterrupt (as a
    Ctrl-C does), whatever was inherited."""
    for signum in signals:
        signal.signal(signum, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
