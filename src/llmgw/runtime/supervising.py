"""The process supervisor: every long-lived component of a process, run by name under one policy.

A wiring (``controlplane/running.py``, ``agent/running.py``) registers each
component with :meth:`Supervisor.add` and runs :meth:`Supervisor.run`. A
component is an ``async`` function that runs until cancelled. When one fails:

- the failure is logged with its traceback and kept in the component's
  :class:`~llmgw.core.health.ComponentHealth` (``supervisor.health()``, shown
  by ``/api/status``);
- ``RESTART``: it runs again after an exponential backoff on the injected
  clock; the backoff starts over once a run lasted ``healthy_after_s``;
- ``FATAL``: :meth:`Supervisor.run` stops every component and raises
  :class:`ComponentFailed`, which the CLI turns into exit code 1.

Nothing runs half-dead: a component is running, waiting out its backoff, or
stopped, and its state says which. A component added with ``start=False``
(leader-only work) runs only between :meth:`Supervisor.start` and
:meth:`Supervisor.stop`. Cancelling :meth:`Supervisor.run` (or
:meth:`Supervisor.shutdown`) stops every component.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmgw.core.backoff import Backoff
from llmgw.core.health import ComponentHealth, ComponentState
from llmgw.errors import LlmgwError
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

Component = Callable[[], Awaitable[None]]
"""Starts one run of a component: a coroutine that runs until cancelled (or fails)."""


class Policy(enum.Enum):
    """What a component's failure does."""

    RESTART = "restart"
    """Run it again after a backoff; the process keeps serving."""
    FATAL = "fatal"
    """End the process: :meth:`Supervisor.run` raises :class:`ComponentFailed`."""


class ComponentFailed(LlmgwError):
    """A FATAL component failed; the process ends with it."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(
            f"component {name} failed: {describe(error)}",
            hint="the log above holds its traceback; fix the cause and start the process again",
        )
        self.name = name
        self.error = error


def describe(error: BaseException) -> str:
    """An exception as ``Type: message`` (a group of one: the exception it holds)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclass(frozen=True)
class RestartSettings:
    """How a RESTART component is started again."""

    backoff_s: float = 0.5
    """The first wait after a failure."""
    backoff_max_s: float = 30.0
    """The longest wait, however many failures in a row."""
    healthy_after_s: float = 60.0
    """A run that lasted this long counts as a success: the next failure waits ``backoff_s`` again."""


@dataclass
class _Entry:
    name: str
    component: Component
    policy: Policy
    wanted: bool
    state: ComponentState = ComponentState.STOPPED
    restarts: int = 0
    last_error: str = ""
    last_error_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def health(self) -> ComponentHealth:
        return ComponentHealth(self.name, self.state, self.restarts, self.last_error, self.last_error_at)


class Supervisor:
    """Runs a process's components by name, each under its :class:`Policy`."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, settings: RestartSettings | None = None) -> None:
        self._clock = clock
        self.settings = settings or RestartSettings()
        self._entries: dict[str, _Entry] = {}
        self._group: asyncio.TaskGroup | None = None
        self._ended = asyncio.Event()
        self._fatal: ComponentFailed | None = None

    def add(
        self, name: str, component: Component, policy: Policy = Policy.RESTART, *, start: bool = True
    ) -> None:
        """Register ``component``; with ``start=False`` it waits for :meth:`start` (leader-only work)."""
        if name in self._entries:
            raise ValueError(f"a component named {name!r} is already registered")
        entry = _Entry(name, component, policy, wanted=start)
        if start:
            entry.state = ComponentState.STARTING
        self._entries[name] = entry
        if start and self._group is not None and not self._ended.is_set():
            self._spawn(entry)

    def health(self) -> list[ComponentHealth]:
        """Every component's state, restarts and last error, in the order they were added."""
        return [entry.health() for entry in self._entries.values()]

    def running(self, name: str) -> bool:
        """Whether ``name`` runs now (or waits out its backoff to run again)."""
        task = self._entries[name].task
        return task is not None and not task.done()

    def start(self, name: str) -> None:
        """Run ``name`` (again) if it is not running; before :meth:`run`, it starts with the others."""
        entry = self._entries[name]
        entry.wanted = True
        if entry.task is not None and not entry.task.done():
            return
        entry.state = ComponentState.STARTING
        if self._group is not None and not self._ended.is_set():
            self._spawn(entry)

    async def stop(self, name: str) -> None:
        """Stop ``name`` and wait until it has; it stays stopped until :meth:`start`."""
        entry = self._entries[name]
        entry.wanted = False
        task, entry.task = entry.task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        if entry.state != ComponentState.FAILED:
            entry.state = ComponentState.STOPPED

    def shutdown(self) -> None:
        """Make :meth:`run` stop every component and return."""
        self._ended.set()

    async def run(self) -> None:
        """Run the components until :meth:`shutdown` or cancellation; ComponentFailed if a FATAL one fails."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for entry in self._entries.values():
                    if entry.wanted:
                        self._spawn(entry)
                await self._ended.wait()
                for entry in reversed(list(self._entries.values())):
                    if entry.task is not None:
                        entry.task.cancel()
        finally:
            self._group = None
            for entry in self._entries.values():
                entry.task = None
                if entry.state != ComponentState.FAILED:
                    entry.state = ComponentState.STOPPED
        if self._fatal is not None:
            raise self._fatal

    def _spawn(self, entry: _Entry) -> None:
        assert self._group is not None
        entry.task = self._group.create_task(self._keep(entry), name=entry.name)

    async def _keep(self, entry: _Entry) -> None:
        """Run one component under its policy until it is stopped, returns, or fails fatally."""
        backoff = Backoff(self.settings.backoff_s, 2.0, self.settings.backoff_max_s)
        while True:
            entry.state = ComponentState.RUNNING
            began = self._clock.monotonic()
            try:
                await entry.component()
            except asyncio.CancelledError:
                entry.state = ComponentState.STOPPED
                raise
            except Exception as error:
                self._failed(entry, error)
                if entry.policy is Policy.FATAL:
                    entry.state = ComponentState.FAILED
                    self._fatal = self._fatal or ComponentFailed(entry.name, error)
                    self._ended.set()
                    return
            else:
                log.info("component %s ended", entry.name)
                entry.state = ComponentState.STOPPED
                return
            if self._clock.monotonic() - began >= self.settings.healthy_after_s:
                backoff.reset()
            delay = backoff.next_delay()
            entry.state = ComponentState.RESTARTING
            entry.restarts += 1
            log.warning("component %s starts again in %.1f s (restart %d)", entry.name, delay, entry.restarts)
            await self._clock.sleep(delay)

    def _failed(self, entry: _Entry, error: Exception) -> None:
        entry.last_error = describe(error)
        entry.last_error_at = self._clock.time()
        log.error(
            "component %s failed (%s): %s",
            entry.name,
            "the process ends" if entry.policy is Policy.FATAL else "restarting it",
            entry.last_error,
            exc_info=error,
        )
