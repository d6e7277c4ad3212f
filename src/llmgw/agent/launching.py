"""Launching an engine process: the one place the agent spawns one, behind a seam tests replace.

:class:`ShardSupervisor <llmgw.agent.supervising.ShardSupervisor>` hands a
:class:`Launcher` an :class:`EngineSpawn` (the command line, environment,
output descriptor and spawn options) and gets back an :class:`EngineProcess`
handle: its pid, its exit code once it ended, a way to wait for that, and
signals. Production uses :class:`SubprocessLauncher`; a unit test passes a
launcher of fake processes and drives them on a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmgw.core.engines import KeyInput
from llmgw.errors import LlmgwError
from llmgw.runtime.clock import Clock
from llmgw.runtime.files import write_private


class EngineProcess(Protocol):
    """A running (or ended) engine: a child the agent spawned, or one it adopted."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None:
        """The exit code once the process ended (negative: the signal that ended it); None while it runs."""
        ...

    async def wait(self) -> int:
        """Wait for the process to end; its exit code."""
        ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...


@dataclass(frozen=True)
class EngineSpawn:
    """What to start: an engine's command line, and how."""

    command: list[str]
    env: dict[str, str]
    output: int
    """The descriptor its stdout and stderr go to (the launcher does not close it)."""
    cwd: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Further ``create_subprocess_exec`` options: the engine user's credentials and home."""


Launcher = Callable[[EngineSpawn], Awaitable[EngineProcess]]
"""Starts one engine process; OSError when it cannot."""

Owner = tuple[int, int]
"""The uid and gid a key file is handed to (the engine's user, where engines run as another)."""


def write_key_file(
    directory: Path,
    source: KeyInput,
    key: str,
    owner: Owner | None = None,
    chown: Callable[[Path, int, int], None] = os.chown,
) -> Path | None:
    """Write the replica's key where its engine reads it; the file's path, or None (a variable).

    The file is created 0600 and renamed into place whole
    (:func:`~llmgw.runtime.files.write_private`), then handed to ``owner``, so
    only the agent and the engine's user can ever read it. LlmgwError when it
    cannot be written.
    """
    if not source.in_file:
        return None
    try:
        path = write_private(directory / source.filename, source.file_text(key).encode())
        if owner is not None:
            chown(path, *owner)
    except OSError as error:
        raise LlmgwError(
            f"cannot write the replica's key file in {directory}: {error.strerror}",
            "check that the agent's work_dir is writable by the agent and on a disk with room",
        ) from None
    return path


def kill_group(pid: int) -> bool:
    """SIGKILL every process of the group ``pid`` leads; False where ``pid`` leads none (or it is gone).

    An engine is started in a session of its own, so it leads a process group holding every process
    it started: vLLM's API server forks an engine core and workers that a SIGKILL sent to the server
    alone would leave running, holding memory and cores."""
    try:
        if os.getpgid(pid) != pid:
            return False
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class EngineGroup:
    """A spawned engine: killing it kills its whole process group (:func:`kill_group`)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    def send_signal(self, signum: int) -> None:
        self._process.send_signal(signum)

    def kill(self) -> None:
        if not kill_group(self._process.pid):
            self._process.kill()


class SubprocessLauncher:
    """Spawns engines as real processes in a session of their own, so they outlive the agent; killing
    one kills every process it started (:class:`EngineGroup`).

    util-linux's ``setsid`` takes the engine out of the agent's session after
    its exec, not in the agent's spawning child (which shares the agent's
    memory until it execs); without it, the child starts a new session itself.
    """

    def __init__(self, setsid: str | None = None) -> None:
        self._setsid = setsid if setsid is not None else shutil.which("setsid")

    async def __call__(self, spawn: EngineSpawn) -> EngineProcess:
        command = [self._setsid, "--", *spawn.command] if self._setsid else spawn.command
        options: dict[str, Any] = {"cwd": spawn.cwd} if spawn.cwd is not None else {}
        options.update(spawn.options)
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=spawn.output,
            stderr=spawn.output,
            env=spawn.env,
            start_new_session=self._setsid is None,
            **options,
        )
        return EngineGroup(process)


async def ended_within(process: EngineProcess, seconds: float, clock: Clock) -> bool:
    """Wait up to ``seconds`` of ``clock`` for ``process`` to end; whether it did."""
    ended = asyncio.ensure_future(process.wait())
    try:
        return await done_within(ended, seconds, clock)
    finally:
        await cancelled(ended)


async def done_within(waiting: asyncio.Future[Any], seconds: float, clock: Clock) -> bool:
    """Wait up to ``seconds`` of ``clock`` for ``waiting`` (left running); whether it is done."""
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancelled(timer)
    return waiting.done()


async def cancelled(waiting: asyncio.Future[Any]) -> None:
    """Cancel ``waiting`` unless it is done, and let it finish."""
    if not waiting.done():
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
