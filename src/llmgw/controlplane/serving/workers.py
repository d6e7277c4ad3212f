"""Gateway worker processes: started by their control plane, restarted with backoff, stopped with it.

With ``gateway.workers`` above 1, a control plane starts that many
``llmgw server worker`` processes (:func:`worker_command`). Each binds the
HTTP port with ``SO_REUSEPORT`` and the kernel spreads new connections over
them; each answers ``/v1`` from its own copy of the gateway's state, fed over
the local channel (:mod:`llmgw.controlplane.statesharing.localchannel`), and hands
everything else to the control plane over its Unix socket
(:mod:`llmgw.controlplane.serving.workerserving`).

:class:`WorkerSupervisor` keeps each worker running: one that exits is
started again after a backoff (which starts again once a worker ran
:data:`STEADY_S`); while it is away the kernel gives new connections to the
others (its own connections end with it). :meth:`WorkerSupervisor.stop` sends
SIGTERM to each, waits the grace, then SIGKILL. A worker also stops by itself
when its control plane is gone (its parent changes).

Across a restart of its control plane (``selfrestart.py``) the workers keep
running: :meth:`WorkerSupervisor.hand_over` leaves them be, and the next
start :func:`retire` s them once its own workers serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from llmgw.core.backoff import Backoff
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

MAX_DEFAULT = 8
"""Most workers ``gateway.workers: 0`` (the machine's cores) starts."""
STEADY_S = 10.0
"""A worker that ran this long resets its backoff."""
STOP_GRACE_S = 5.0
"""How long a stopping worker may finish its requests before SIGKILL."""
RETIRE_WAIT_S = 60.0
"""Longest the workers of a previous start are kept waiting for this start's to serve."""
POLL_S = 0.05

_HANDED_OVER: list[object] = []
"""The processes handed over, kept referenced until the exec: asyncio kills a child whose transport
is collected while it runs."""


def worker_count(setting: int, cores: int | None = None) -> int:
    """The workers ``gateway.workers`` asks for: 0 is one fewer than the machine's cores (one core stays
    with the control plane's own work: its reconciler, streams and relays), at least 1 and at most
    :data:`MAX_DEFAULT`. On two cores that is this process alone: workers measured no faster there
    (bench/gateway/README.md, "Workers")."""
    if setting > 0:
        return setting
    return max(1, min(MAX_DEFAULT, (cores if cores is not None else (os.cpu_count() or 1)) - 1))


class WorkerProcess(Protocol):
    """What supervision needs of a started worker (``asyncio.subprocess.Process`` is one)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


Launch = Callable[[int], Awaitable[WorkerProcess]]
"""Starts worker number ``index``."""


def worker_command(config_path: Path, port: int, index: int, log_args: Sequence[str] = ()) -> list[str]:
    """The command line of worker ``index`` of the control plane configured by ``config_path``."""
    return [
        sys.executable,
        "-m",
        "llmgw.cli.main",
        "server",
        "worker",
        "--config",
        str(config_path),
        "--port",
        str(port),
        "--index",
        str(index),
        *log_args,
    ]


def subprocess_launcher(config_path: Path, port: int, log_args: Sequence[str] = ()) -> Launch:
    """Starts workers as subprocesses of this process, their output on this process's."""

    async def launch(index: int) -> WorkerProcess:
        return await asyncio.create_subprocess_exec(*worker_command(config_path, port, index, log_args))

    return launch


class WorkerSupervisor:
    """``count`` workers kept running until :meth:`stop`."""

    def __init__(
        self,
        count: int,
        launch: Launch,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Callable[[], Backoff] = lambda: Backoff(base=0.5, cap=30.0),
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.count = count
        self._launch = launch
        self._clock = clock
        self._backoff = backoff
        self._stop_grace_s = stop_grace_s
        self._running: dict[int, WorkerProcess] = {}
        self.restarts = [0] * count
        """Per worker, how often it was started again."""
        self._stopping = False

    @property
    def pids(self) -> dict[int, int]:
        """The pid of each worker running now, by index."""
        return {index: process.pid for index, process in self._running.items() if process.returncode is None}

    async def run(self) -> None:
        """Start every worker and keep it running (until cancelled, or :meth:`stop`)."""
        async with asyncio.TaskGroup() as tasks:
            for index in range(self.count):
                tasks.create_task(self._keep(index), name=f"worker-{index}")

    async def _keep(self, index: int) -> None:
        backoff = self._backoff()
        while not self._stopping:
            started = self._clock.monotonic()
            try:
                process = await self._launch(index)
            except OSError as error:
                log.error("cannot start gateway worker %d: %s", index, error)
            else:
                self._running[index] = process
                code = await process.wait()
                if self._stopping:
                    return
                log.warning("gateway worker %d (pid %d) exited with code %s", index, process.pid, code)
            if self._clock.monotonic() - started >= STEADY_S:
                backoff.reset()
            delay = backoff.next_delay()
            log.info("starting gateway worker %d again in %.1f s", index, delay)
            await self._clock.sleep(delay)
            self.restarts[index] += 1

    def hand_over(self) -> list[int]:
        """The running workers' pids, left running for the next start of this process (nothing is
        started again from now on)."""
        self._stopping = True
        running = [process for process in self._running.values() if process.returncode is None]
        _HANDED_OVER.extend(running)
        return [process.pid for process in running]

    async def stop(self) -> None:
        """SIGTERM to every worker; SIGKILL to those still running after the grace."""
        self._stopping = True
        running = [process for process in self._running.values() if process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        waits = [asyncio.ensure_future(process.wait()) for process in running]
        if not waits:
            return
        _, late = await asyncio.wait(waits, timeout=self._stop_grace_s)
        for process in running:
            if process.returncode is None:
                log.warning(
                    "gateway worker pid %d did not stop in %.0f s: killed", process.pid, self._stop_grace_s
                )
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        if late:
            await asyncio.wait(late)


def _reaped(pid: int) -> bool:
    """Whether child ``pid`` has exited (and is reaped now), or is no child of this process."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


async def retire(
    pids: Sequence[int],
    ready: Callable[[], bool],
    clock: Clock = SYSTEM_CLOCK,
    wait_s: float = RETIRE_WAIT_S,
    grace_s: float = STOP_GRACE_S,
) -> None:
    """Stop the workers a previous start of this process left serving (its children: the pid stayed)
    once ``ready`` (this start's own workers serve; :data:`RETIRE_WAIT_S` at most): SIGTERM, so that
    they finish their requests, SIGKILL after ``grace_s``; each is reaped."""
    started = clock.monotonic()
    while not ready() and clock.monotonic() - started < wait_s:
        await clock.sleep(POLL_S)
    log.info("stopping the gateway workers of the previous start (pids %s)", ", ".join(map(str, pids)))
    _signal(pids, signal.SIGTERM)
    left = [pid for pid in pids if not _reaped(pid)]
    stopping = clock.monotonic()
    while left and clock.monotonic() - stopping < grace_s:
        await clock.sleep(POLL_S)
        left = [pid for pid in left if not _reaped(pid)]
    if left:
        log.warning("gateway workers %s of the previous start did not stop in %.0f s: killed", left, grace_s)
        _signal(left, signal.SIGKILL)
        while left:
            await clock.sleep(POLL_S)
            left = [pid for pid in left if not _reaped(pid)]
