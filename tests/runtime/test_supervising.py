"""The process supervisor: restarts with backoff, FATAL ends the run, health records, clean stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from llmgw.core.health import ComponentState
from llmgw.runtime.supervising import ComponentFailed, Policy, RestartSettings, Supervisor
from llmgw.testing.clock import FakeClock


class Flaky:
    """A component that fails ``failures`` times, then runs until cancelled."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or RuntimeError("boom")
        self.runs = 0
        self.cancelled = 0
        self.running = asyncio.Event()

    async def __call__(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise self.error
        self.running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def supervisor(clock: FakeClock) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(clock, RestartSettings(backoff_s=1.0, backoff_max_s=8.0, healthy_after_s=60.0))
    yield supervisor
    supervisor.shutdown()


async def test_a_failed_component_restarts_after_a_growing_backoff(
    supervisor: Supervisor, clock: FakeClock
) -> None:
    flaky = Flaky(failures=3)
    supervisor.add("reader", flaky)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(supervisor.run())
        await settle()
        assert (flaky.runs, supervisor.health()[0].state) == (1, ComponentState.RESTARTING)
        await clock.advance(0.9)
        assert flaky.runs == 1  # the first wait is 1 s
        await clock.advance(0.1)
        assert flaky.runs == 2
        await clock.advance(1.9)
        assert flaky.runs == 2  # then 2 s
        await clock.advance(0.1)
        assert flaky.runs == 3
        await clock.advance(4.0)  # then 4 s
        await flaky.running.wait()
        health = supervisor.health()[0]
        assert (health.state, health.restarts) == (ComponentState.RUNNING, 3)
        supervisor.shutdown()


async def test_the_backoff_starts_over_after_a_run_that_lasted(
    supervisor: Supervisor, clock: FakeClock
) -> None:
    runs: list[float] = []

    async def fails_after_a_while() -> None:
        runs.append(clock.monotonic())
        await clock.sleep(100.0 if len(runs) == 3 else 0.0)
        raise RuntimeError("lost")

    supervisor.add("session", fails_after_a_while)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(supervisor.run())
        await settle()
        await clock.advance(1.0)  # first restart after 1 s
        await clock.advance(2.0)  # second after 2 s; this run lasts 100 s
        await clock.advance(100.0)
        await clock.advance(1.0)  # a long run: back to 1 s, not 4 s
        supervisor.shutdown()
    assert [round(t - runs[0], 1) for t in runs] == [0.0, 1.0, 3.0, 104.0]


async def test_each_failure_is_logged_with_its_traceback_and_kept_in_health(
    supervisor: Supervisor, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor.add("reconciler", Flaky(failures=1, error=RuntimeError("the store vanished")))
    with caplog.at_level(logging.ERROR, logger="llmgw.runtime.supervising"):
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(supervisor.run())
            await settle()
            supervisor.shutdown()
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "reconciler" in record.getMessage() and "RuntimeError: the store vanished" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    health = supervisor.health()[0]
    assert (health.name, health.restarts, health.last_error, health.last_error_at) == (
        "reconciler",
        1,
        "RuntimeError: the store vanished",
        clock.time(),
    )


async def test_a_fatal_failure_stops_every_component_and_ends_the_run_with_the_error(
    supervisor: Supervisor,
) -> None:
    steady = Flaky(failures=0)
    supervisor.add("steady", steady)
    supervisor.add("http", Flaky(failures=1, error=OSError("address in use")), Policy.FATAL)
    with pytest.raises(ComponentFailed) as caught:
        await supervisor.run()
    assert caught.value.name == "http" and "OSError: address in use" in str(caught.value)
    assert steady.cancelled == 1
    states = {h.name: h.state for h in supervisor.health()}
    assert states == {"steady": ComponentState.STOPPED, "http": ComponentState.FAILED}


async def test_cancelling_the_run_stops_every_component(supervisor: Supervisor) -> None:
    one, two = Flaky(failures=0), Flaky(failures=0)
    supervisor.add("one", one)
    supervisor.add("two", two)
    running = asyncio.create_task(supervisor.run())
    await one.running.wait()
    await two.running.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (one.cancelled, two.cancelled) == (1, 1)
    assert {h.state for h in supervisor.health()} == {ComponentState.STOPPED}


async def test_a_component_added_stopped_runs_only_between_start_and_stop(supervisor: Supervisor) -> None:
    reconciler = Flaky(failures=0)
    supervisor.add("reconciler", reconciler, start=False)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(supervisor.run())
        await settle()
        assert (reconciler.runs, supervisor.health()[0].state) == (0, ComponentState.STOPPED)
        supervisor.start("reconciler")
        await reconciler.running.wait()
        assert supervisor.running("reconciler")
        await supervisor.stop("reconciler")
        assert (reconciler.cancelled, supervisor.health()[0].state) == (1, ComponentState.STOPPED)
        supervisor.start("reconciler")
        await settle()
        assert reconciler.runs == 2
        supervisor.shutdown()


async def test_a_component_that_returns_is_stopped_not_restarted(supervisor: Supervisor) -> None:
    runs: list[int] = []

    async def once() -> None:
        runs.append(1)

    supervisor.add("once", once)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(supervisor.run())
        await settle()
        supervisor.shutdown()
    assert (runs, supervisor.health()[0].state) == ([1], ComponentState.STOPPED)


def test_two_components_of_one_name_are_refused(supervisor: Supervisor) -> None:
    supervisor.add("reader", Flaky(0))
    with pytest.raises(ValueError, match="already registered"):
        supervisor.add("reader", Flaky(0))
