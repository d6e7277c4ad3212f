"""C6.2: the router reads each replica's load from its engine's metrics and routes around unreadable ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from llmgw.gateway.loads import LoadReader
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app
from llmgw.testing.eventually import eventually

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
    return Standin(settings)


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
