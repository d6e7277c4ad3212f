"""C6.2: the router reads each replica's load from its engine's metrics and routes around unreadable ones."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from llmgw.core.health import ComponentState
from llmgw.gateway.loads import LoadReader, LoadSettings
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.runtime.supervising import RestartSettings, Supervisor
from llmgw.testing.clock import FakeClock
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app
from llmgw.testing.eventually import eventually
from llmgw.testing.trtllm_standin import TrtllmStandin

Start = Callable[[Standin], Awaitable[str]]
KEY = "sk-replica"


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    runners: list[web.AppRunner] = []

    async def run(standin: Standin) -> str:
        runner = web.AppRunner(build_app(standin))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield run
    for runner in runners:
        await runner.cleanup()


def standin(engine: str, **changes: object) -> Standin:
    settings = StandinSettings(engine=engine, served_name="m", api_key=KEY, startup_s=0.0, decode_s=0.05)
    metrics_path = "/prometheus/metrics" if engine == "trtllm" else "/metrics"
    settings.metrics_path = metrics_path
    for name, value in changes.items():
        setattr(settings, name, value)
    return TrtllmStandin(settings) if engine == "trtllm" else Standin(settings)


async def finish_one(engine: Standin) -> None:
    async for _ in engine.generate([1, 2, 3], 1):
        pass


async def busy(engine: Standin, requests: int) -> list[asyncio.Task[None]]:
    """Hold ``requests`` requests running on ``engine`` (each decoding for a while)."""

    async def one() -> None:
        async for _ in engine.generate([1, 2, 3], 200):
            pass

    tasks = [asyncio.create_task(one()) for _ in range(requests)]
    running = min(requests, engine.settings.max_running)
    await eventually(lambda: engine.running >= running, message=f"{running} requests running on the engine")
    return tasks


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
async def test_the_router_prefers_the_replica_its_engine_reports_idle(start: Start, engine: str) -> None:
    loaded, idle = standin(engine), standin(engine)
    table = ReplicaTable()
    for name, target in (("loaded", loaded), ("idle", idle)):
        table.set_ready(ReplicaEndpoint(name, "m", await start(target), KEY, capacity=4, engine=engine))
        await finish_one(target)  # TensorRT-LLM publishes its queue gauges once a request has finished
    tasks = await busy(loaded, 3)  # another gateway's requests: this router has none in flight
    reader = LoadReader(table)
    try:
        await reader.read_once()
        assert reader.readings["loaded"].load is not None and reader.readings["loaded"].load.running == 3
        assert {table.pick("m").replica_id for _ in range(4)} == {"idle"}  # type: ignore[union-attr]
    finally:
        for task in tasks:
            task.cancel()
        await reader.close()


async def test_a_fresh_trtllm_replica_without_queue_gauges_is_routed_by_the_routers_own_count(
    start: Start,
) -> None:
    table = ReplicaTable()
    for name in ("held", "free"):
        table.set_ready(
            ReplicaEndpoint(name, "m", await start(standin("trtllm")), KEY, capacity=4, engine="trtllm")
        )
    reader = LoadReader(table)
    try:
        await reader.read_once()
        assert {name: reading.error for name, reading in reader.readings.items()} == {"held": "", "free": ""}
        first = table.pick("m")
        assert first is not None
        lease = table.acquire(first)  # this router's own request in flight on it
        try:
            await reader.read_once()
            assert {table.pick("m").replica_id for _ in range(4)} == {"free", "held"} - {first.replica_id}  # type: ignore[union-attr]
        finally:
            lease.release()
    finally:
        await reader.close()


async def test_a_replica_whose_metrics_cannot_be_read_is_routed_around(start: Start) -> None:
    blind, seen = standin("sglang", metrics_on=False), standin("sglang")
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("blind", "m", await start(blind), KEY, capacity=4, engine="sglang"))
    table.set_ready(ReplicaEndpoint("seen", "m", await start(seen), KEY, capacity=4, engine="sglang"))
    reader = LoadReader(table)
    try:
        await reader.read_once()
        assert "404" in reader.readings["blind"].error
        assert {table.pick("m").replica_id for _ in range(4)} == {"seen"}  # type: ignore[union-attr]
        blind.settings.metrics_on = True
        await reader.read_once()
        assert {table.pick("m").replica_id for _ in range(4)} == {"blind", "seen"}  # type: ignore[union-attr]
    finally:
        await reader.close()


async def test_a_model_with_no_readable_replica_gets_none(start: Start) -> None:
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("gone", "m", "http://127.0.0.1:9", KEY, engine="vllm"))
    reader = LoadReader(table)
    try:
        await reader.read_once()
        assert reader.readings["gone"].failures == 1
        assert table.pick("m") is None
    finally:
        await reader.close()


async def test_a_replica_whose_reads_keep_failing_is_read_less_often_up_to_a_bound(start: Start) -> None:
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("gone", "m", "http://127.0.0.1:9", KEY, engine="vllm"))
    reader = LoadReader(table, LoadSettings(unreadable_every=4))
    try:
        failures = []
        for _ in range(16):
            await reader.read_once()
            failures.append(reader.readings["gone"].failures)
        # read in rounds 1, 2, 4, 8, 12, 16: after 1, 2, then 4 rounds (the bound)
        assert failures == [1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6]
    finally:
        await reader.close()


async def test_at_most_the_set_number_of_reads_run_at_once(start: Start) -> None:
    table = ReplicaTable()
    for n in range(6):
        table.set_ready(ReplicaEndpoint(f"r{n}", "m", await start(standin("vllm")), KEY, engine="vllm"))
    limited, unlimited = LoadReader(table, LoadSettings(concurrency=2)), LoadReader(table)
    try:
        await limited.read_once()
        await unlimited.read_once()
        assert all(reading.load is not None for reading in limited.readings.values())
        assert limited.most_at_once == 2
        assert unlimited.most_at_once == 6
    finally:
        await limited.close()
        await unlimited.close()


async def test_metrics_of_the_wrong_engine_count_as_unreadable(start: Start) -> None:
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("r", "m", await start(standin("vllm")), KEY, engine="sglang"))
    reader = LoadReader(table)
    try:
        await reader.read_once()
        assert "sglang:num_running_reqs" in reader.readings["r"].error
        assert table.pick("m") is None
    finally:
        await reader.close()


def metrics_app(body: bytes) -> web.Application:
    """An engine whose /metrics answers ``body`` as it is."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@pytest.fixture
async def serve_metrics() -> AsyncIterator[Callable[[bytes], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def run(body: bytes) -> str:
        runner = web.AppRunner(metrics_app(body))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield run
    for runner in runners:
        await runner.cleanup()


VLLM_GAUGES = b"vllm:num_requests_running %s\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (VLLM_GAUGES % b"+Inf", "which is not a count"),
        (VLLM_GAUGES % b"NaN", "num_requests_running"),
        (b"\xff\xfe\x00binary\x80\x81", "not Prometheus text"),
    ],
)
async def test_a_gauge_that_is_no_count_or_binary_metrics_make_only_that_replica_unreadable(
    start: Start, serve_metrics: Callable[[bytes], Awaitable[str]], body: bytes, why: str
) -> None:
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("odd", "m", await serve_metrics(body), KEY, capacity=4, engine="vllm"))
    table.set_ready(
        ReplicaEndpoint("fine", "m", await start(standin("vllm")), KEY, capacity=4, engine="vllm")
    )
    reader = LoadReader(table)
    try:
        await reader.read_once()
        assert why in reader.readings["odd"].error and reader.readings["odd"].load is None
        assert reader.readings["fine"].load is not None
        assert {table.pick("m").replica_id for _ in range(4)} == {"fine"}  # type: ignore[union-attr]
    finally:
        await reader.close()


async def until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop run until ``condition`` holds (a bounded number of turns, no wall-clock wait)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class BrokenOnce(ReplicaTable):
    """A table whose first listing fails: an error inside the reader itself, not one replica's."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = 0

    def endpoints(self) -> list[ReplicaEndpoint]:
        self.listed += 1
        if self.listed == 1:
            raise RuntimeError("table broken")
        return super().endpoints()


async def test_a_reader_that_fails_is_logged_shown_in_health_and_runs_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    table = BrokenOnce()
    reader = LoadReader(table, clock=clock)
    supervisor = Supervisor(clock, RestartSettings(backoff_s=1.0))
    supervisor.add("load-reader", reader.run)
    with caplog.at_level(logging.ERROR):
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(supervisor.run())
            await until(lambda: supervisor.health()[0].state == ComponentState.RESTARTING)
            assert supervisor.health()[0].last_error == "RuntimeError: table broken"
            await clock.advance(1.0)
            await until(lambda: table.listed == 2)
            assert supervisor.health()[0].state == ComponentState.RUNNING
            supervisor.shutdown()
    assert any(r.exc_info and "load-reader" in r.getMessage() for r in caplog.records)
