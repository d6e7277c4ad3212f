"""An engine process this agent did not start: signalled by pid, waited on with a pidfd.

It answers what the supervisor asks of an ``asyncio.subprocess.Process``
(``pid``, ``returncode``, ``wait``, ``send_signal``, ``kill``), so an adopted
shard stops like any other. A pid is signalled only while it is still the
process the state file recorded (same start time), never a reused one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from llmgw.agent.launching import kill_group
from llmgw.agent.shardstates import process_start_time, zombie_start_time
from llmgw.runtime.waiting import wait_event

POLL_S = 0.5
"""How often the process is looked for where a pidfd cannot be opened."""


class AdoptedProcess:
    """A running engine found by its pid and start time."""

    def __init__(self, pid: int, start_time: str, proc_root: Path = Path("/proc")) -> None:
        self.pid = pid
        self._start_time = start_time
        self._proc_root = proc_root
        self.returncode: int | None = None
        """None while it runs; once it is gone its exit code when it was this process's child,
        else -1 (the exit code belongs to its parent)."""
        self._gone = asyncio.Event()

    def alive(self) -> bool:
        if self.returncode is not None:
            return False
        if process_start_time(self.pid, self._proc_root) != self._start_time:
            self.returncode = self._reap()
            self._gone.set()
            return False
        return True

    def _reap(self) -> int:
        """Its exit code if it is this process's child, reaped now; -1 when its parent is another.

        An engine started before the agent re-executed itself (new settings,
        RestartAgent) is still the agent's child: unreaped it would stay a
        zombie until the agent ends. Only a zombie with the recorded start time
        is reaped, never a reused pid.
        """
        if zombie_start_time(self.pid, self._proc_root) != self._start_time:
            return -1
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return -1
        return os.waitstatus_to_exitcode(status) if pid == self.pid else -1

    async def wait(self) -> int:
        if not self.alive():
            return self.returncode if self.returncode is not None else -1
        loop = asyncio.get_running_loop()
        descriptor = -1
        with contextlib.suppress(OSError, AttributeError):
            descriptor = os.pidfd_open(self.pid)
        try:
            if descriptor >= 0:
                loop.add_reader(descriptor, self._gone.set)
            while self.alive():
                await wait_event(self._gone, POLL_S if descriptor < 0 else 5.0)
                self._gone.clear()
        finally:
            if descriptor >= 0:
                loop.remove_reader(descriptor)
                os.close(descriptor)
        self._gone.set()
        return self.returncode if self.returncode is not None else -1

    def send_signal(self, signum: int) -> None:
        if not self.alive():
            raise ProcessLookupError(self.pid)
        os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL it and, where it leads its process group (as every engine llmgw starts does), the
        processes it started (:func:`~llmgw.agent.launching.kill_group`)."""
        if not self.alive():
            raise ProcessLookupError(self.pid)
        if not kill_group(self.pid):
            os.kill(self.pid, signal.SIGKILL)
