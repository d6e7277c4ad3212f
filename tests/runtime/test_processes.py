"""The process runner: built, served beside the supervisor, stopped on its signals, closed in reverse."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from llmgw.runtime.processes import STOP_SIGNALS, Process, run_process, shown
from llmgw.runtime.supervising import ComponentFailed, Policy
from llmgw.testing.eventually import eventually


@dataclass(frozen=True)
class Parts:
    closed: list[str]


async def _build(process: Process) -> Parts:
    closed: list[str] = []
    process.closing.callback(closed.append, "first")
    process.closing.callback(closed.append, "second")
    return Parts(closed)


async def test_a_fatal_components_failure_ends_the_run_with_its_error_alone_and_closes_every_part() -> None:
    served: list[str] = []

    async def broken() -> None:
        raise OSError("the disk is full")

    async def serve(parts: Parts, process: Process) -> None:
        process.supervisor.add("writer", broken, Policy.FATAL)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            served.append("cancelled")
            raise

    process = Process()
    with pytest.raises(ComponentFailed, match="writer failed: OSError: the disk is full"):
        await run_process(_build, serve, process, signals=())
    assert served == ["cancelled"]
    assert process.supervisor.health()[0].last_error == "OSError: the disk is full"


async def test_serve_returning_stops_the_components_then_closes_the_parts_in_reverse() -> None:
    order: list[str] = []

    async def component() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("component stopped")

    async def serve(parts: Parts, process: Process) -> None:
        process.supervisor.add("work", component)
        await process.stop.wait()
        order.append("served")

    process = Process()
    running = asyncio.create_task(run_process(_build, serve, process, signals=()))
    await eventually(lambda: process.supervisor.running("work"))
    process.stop.set()
    parts = await asyncio.wait_for(running, 5)
    assert order == ["served", "component stopped"]
    assert parts.closed == ["second", "first"]


async def test_an_error_of_serve_is_raised_as_it_is_and_the_parts_are_closed() -> None:
    async def serve(parts: Parts, process: Process) -> None:
        process.supervisor.add("work", lambda: asyncio.Event().wait())
        raise ValueError("no such model")

    process = Process()
    with pytest.raises(ValueError, match="no such model"):
        await run_process(_build, serve, process, signals=())
    assert not process.supervisor.running("work")


async def test_a_build_that_fails_closes_what_it_had_built() -> None:
    closed: list[str] = []

    async def build(process: Process) -> Parts:
        process.closing.callback(closed.append, "store")
        raise OSError("cannot open the store")

    async def serve(parts: Parts, process: Process) -> None:
        raise AssertionError("never served")

    with pytest.raises(OSError, match="cannot open the store"):
        await run_process(build, serve, signals=())
    assert closed == ["store"]


def test_the_error_shown_is_a_components_failure_first_then_the_first_that_is_no_cancellation() -> None:
    failed = ComponentFailed("http", OSError("port taken"))
    nested = BaseExceptionGroup(
        "outer", [asyncio.CancelledError(), ExceptionGroup("inner", [ValueError("x"), failed])]
    )
    assert shown(nested) is failed
    first = KeyError("k")
    assert shown(BaseExceptionGroup("g", [asyncio.CancelledError(), first, ValueError("v")])) is first


PROGRAM = """
import asyncio, signal
from llmgw.runtime.processes import run_process

assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "started with SIGINT ignored"

async def build(process):
    process.closing.callback(print, "closed", flush=True)
    return None

async def serve(parts, process):
    process.supervisor.add("work", lambda: asyncio.Event().wait())
    print("ready", flush=True)
    await process.stop.wait()
    print("stopping", flush=True)

asyncio.run(run_process(build, serve))
"""


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_process_stops_cleanly_on_each_stop_signal_though_it_started_with_sigint_ignored(
    signum: int,
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True, preexec_fn=_ignoring_sigint
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signum)
    assert child.wait(30) == 0
    assert child.stdout.read().split("\n")[:2] == ["stopping", "closed"]
