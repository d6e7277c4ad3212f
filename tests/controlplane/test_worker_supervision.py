"""Gateway workers kept running by their control plane: started, restarted with backoff, stopped."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys

from llmgw.controlplane.serving.workers import WorkerSupervisor, retire, worker_command, worker_count
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

PIDS = itertools.count(100)


class FakeWorker:
    """A started worker: it runs until it exits, is terminated (unless ``stubborn``) or is killed."""

    def __init__(self, index: int, stubborn: bool = False) -> None:
        self.index = index
        self.pid = next(PIDS)
        self.returncode: int | None = None
        self.stubborn = stubborn
        self.signals: list[int] = []
        self._ended = asyncio.Event()

    def exit(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)
        if not self.stubborn:
            self.exit(-signal.SIGTERM)

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.exit(-signal.SIGKILL)


class Launcher:
    def __init__(self, stubborn: bool = False) -> None:
        self.started: list[FakeWorker] = []
        self.stubborn = stubborn

    async def __call__(self, index: int) -> FakeWorker:
        worker = FakeWorker(index, self.stubborn)
        self.started.append(worker)
        return worker

    def of(self, index: int) -> list[FakeWorker]:
        return [w for w in self.started if w.index == index]


def test_the_count_is_the_setting_or_the_cores_at_most_eight() -> None:
    assert worker_count(3, cores=16) == 3
    assert worker_count(0, cores=2) == 1
    assert worker_count(0, cores=4) == 3
    assert worker_count(0, cores=64) == 8
    assert worker_count(1, cores=64) == 1


def test_a_worker_runs_the_hidden_command_with_the_port_its_control_plane_holds(tmp_path: object) -> None:
    command = worker_command(tmp_path / "w.yaml", 8080, 1, ["--log-level", "info", "--log-json"])  # type: ignore[operator]
    assert command[1:] == [
        "-m",
        "llmgw.cli.main",
        "server",
        "worker",
        "--config",
        f"{tmp_path}/w.yaml",
        "--port",
        "8080",
        "--index",
        "1",
        "--log-level",
        "info",
        "--log-json",
    ]


async def test_a_worker_that_exits_is_started_again_with_growing_backoff() -> None:
    clock = FakeClock()
    launch = Launcher()
    workers = WorkerSupervisor(2, launch, clock=clock)
    running = asyncio.ensure_future(workers.run())
    try:
        await eventually(lambda: len(launch.started) == 2)
        assert sorted(workers.pids) == [0, 1]
        first = launch.of(1)[0]
        first.exit(1)
        await eventually(lambda: clock.sleepers == 1)
        assert 1 not in workers.pids  # gone; the kernel gives its connections to the other
        await clock.advance(0.4)
        assert len(launch.of(1)) == 1  # not before the backoff (0.5 s)
        await clock.advance(0.1)
        await eventually(lambda: len(launch.of(1)) == 2)
        assert workers.restarts == [0, 1]
        launch.of(1)[1].exit(1)  # a quick failure again: the delay doubles
        await eventually(lambda: clock.sleepers == 1)
        await clock.advance(0.9)
        assert len(launch.of(1)) == 2
        await clock.advance(0.1)
        await eventually(lambda: len(launch.of(1)) == 3)
        second = launch.of(1)[2]
        await clock.advance(30)  # it ran long enough: the backoff starts again
        second.exit(1)
        await eventually(lambda: clock.sleepers == 1)
        await clock.advance(0.5)
        await eventually(lambda: len(launch.of(1)) == 4)
        assert len(launch.of(0)) == 1  # the other worker was left alone
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_stopping_terminates_every_worker_and_kills_one_that_does_not_stop() -> None:
    launch = Launcher(stubborn=True)
    workers = WorkerSupervisor(2, launch, clock=FakeClock(), stop_grace_s=0.05)
    running = asyncio.ensure_future(workers.run())
    await eventually(lambda: len(launch.started) == 2)
    launch.started[0].stubborn = False
    await workers.stop()
    assert launch.started[0].signals == [signal.SIGTERM]
    assert launch.started[1].signals == [signal.SIGTERM, signal.SIGKILL]
    await asyncio.wait_for(running, 1)  # the supervision ends without starting them again
    assert len(launch.started) == 2


async def test_workers_handed_over_keep_running_and_are_not_started_again() -> None:
    launch = Launcher()
    workers = WorkerSupervisor(2, launch, clock=FakeClock())
    running = asyncio.ensure_future(workers.run())
    await eventually(lambda: len(launch.started) == 2)
    assert sorted(workers.hand_over()) == sorted(w.pid for w in launch.started)
    running.cancel()  # the control plane's supervision ends before its exec
    await asyncio.gather(running, return_exceptions=True)
    launch.started[0].exit(0)
    await asyncio.sleep(0)
    assert all(w.signals == [] for w in launch.started) and len(launch.started) == 2


def child(ignore_term: bool) -> subprocess.Popen[bytes]:
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('up', flush=True)\ntime.sleep(60)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    return process


def reaped(pid: int) -> bool:
    """Whether ``pid`` is no child of this process any more (retire reaped it: nothing left to wait for)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


async def test_the_workers_of_the_previous_start_stop_once_this_starts_serve_and_are_reaped() -> None:
    polite, stubborn = child(ignore_term=False), child(ignore_term=True)
    ready = asyncio.Event()
    asked: list[bool] = []

    def serving() -> bool:
        asked.append(ready.is_set())
        return asked[-1]

    retiring = asyncio.ensure_future(retire([polite.pid, stubborn.pid], serving, grace_s=0.3))
    await eventually(lambda: len(asked) >= 3, message="retire asked, and waited, three times")
    assert polite.poll() is None and stubborn.poll() is None  # kept while this start's do not serve
    ready.set()
    await asyncio.wait_for(retiring, 5)
    assert reaped(polite.pid) and reaped(stubborn.pid)


async def test_they_stop_anyway_when_this_starts_workers_never_serve() -> None:
    process = child(ignore_term=False)
    await asyncio.wait_for(retire([process.pid], lambda: False, wait_s=0.2), 5)
    assert reaped(process.pid)
