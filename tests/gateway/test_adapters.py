"""Runtime LoRA: loaded once however many requests arrive together; LRU idle adapters make room."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from llmgw.gateway import Gateway, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.adapters import LOADS, UNLOADS, AdapterLoadFailed, Adapters
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.upstream import Upstream
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app
from llmgw.testing.eventually import eventually
from llmgw.testing.serving import serving

from .conftest import SECRET


class Gate:
    """The stand-in's sleep seam: LoRA loads wait until the test opens the gate."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waits = 0

    async def sleep(self, seconds: float) -> None:
        self.waits += 1
        await self.opened.wait()


@pytest.fixture
async def replica() -> AsyncIterator[tuple[Standin, Gate, str]]:
    gate = Gate()
    settings = StandinSettings(
        engine="vllm", served_name="base", api_key="k", max_loras=2, runtime_lora=True, startup_s=0
    )
    standin = Standin(settings, sleep=gate.sleep)
    runner = web.AppRunner(build_app(standin))
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield standin, gate, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _adapters(url: str) -> tuple[Adapters, Upstream]:
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("r0", "base", url, "k", capacity=8, engine="vllm"))
    upstream = Upstream(GatewaySettings())
    adapters = Adapters(table, upstream)
    for name in ("a", "b", "c"):
        adapters.register(name, "base", f"/adapters/{name}", max_loaded=2)
    return adapters, upstream


async def test_many_requests_at_once_load_an_adapter_once(replica: tuple[Standin, Gate, str]) -> None:
    standin, gate, url = replica
    adapters, upstream = _adapters(url)
    before = LOADS.labels("base")._value.get()
    placing = [asyncio.create_task(adapters.place("a", b"req")) for _ in range(8)]
    # the one load is in the engine now; the other seven wait on it
    await eventually(lambda: gate.waits, message="the adapter's load reaches the engine")
    assert not any(task.done() for task in placing)
    gate.opened.set()
    endpoints = await asyncio.gather(*placing)
    assert {e.replica_id for e in endpoints if e is not None} == {"r0"}
    assert gate.waits == 1 and list(standin.adapters) == ["a"]
    assert LOADS.labels("base")._value.get() == before + 1
    await upstream.close()


async def test_the_least_recently_used_idle_adapter_makes_room(replica: tuple[Standin, Gate, str]) -> None:
    standin, gate, url = replica
    gate.opened.set()
    adapters, upstream = _adapters(url)
    residency = adapters.residency("base")
    assert residency is not None
    for name in ("a", "b"):
        await adapters.place(name, b"req")
        adapters.done("r0", name)
    await adapters.place("a", b"req")  # a in use (and most recent): b is the one to go
    unloads = UNLOADS.labels("base")._value.get()
    await adapters.place("c", b"req")
    assert sorted(standin.adapters) == ["a", "c"]
    assert UNLOADS.labels("base")._value.get() == unloads + 1
    assert await adapters.place("b", b"req") is None  # a and c both in use: no room until one ends
    adapters.done("r0", "a")
    assert await adapters.place("b", b"req") is not None
    assert sorted(standin.adapters) == ["b", "c"]
    await upstream.close()


async def test_a_refused_load_is_reported_and_not_remembered(replica: tuple[Standin, Gate, str]) -> None:
    standin, gate, url = replica
    gate.opened.set()
    standin.settings.runtime_lora = False  # the engine was started without runtime LoRA: 404
    adapters, upstream = _adapters(url)
    with pytest.raises(AdapterLoadFailed, match="404"):
        await adapters.place("a", b"req")
    residency = adapters.residency("base")
    assert residency is not None and residency.holders("a") == []
    await upstream.close()


async def test_requests_naming_an_adapter_through_the_gateway(replica: tuple[Standin, Gate, str]) -> None:
    standin, gate, url = replica
    gateway = Gateway(GatewaySettings(request_wait_s=0.3))
    gateway.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice"))
    gateway.catalog.replace([ModelEntry("base")])
    gateway.replicas.set_ready(ReplicaEndpoint("r0", "base", url, "k", capacity=8, engine="vllm"))
    gateway.adapters.register("sql", "base", "/adapters/sql", max_loaded=2)
    body = {"model": "sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with serving(gateway.asgi_app()) as base, aiohttp.ClientSession() as http:

        async def ask() -> int:
            headers = {"Authorization": f"Bearer {SECRET}"}
            async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as response:
                await response.read()
                return response.status

        asking = [asyncio.create_task(ask()) for _ in range(5)]
        # the load is in the engine; every request waits on it
        await eventually(lambda: gate.waits, message="the adapter's load reaches the engine")
        gate.opened.set()
        assert await asyncio.gather(*asking) == [200] * 5
        residency = gateway.adapters.residency("base")
        assert residency is not None and residency.holders("sql") == ["r0"]
        assert list(standin.adapters) == ["sql"]
        unknown = {**body, "model": "not-an-adapter"}
        async with http.post(f"{base}/v1/chat/completions", json=unknown,
                             headers={"Authorization": f"Bearer {SECRET}"}) as response:  # fmt: skip
            assert response.status == 404
    await gateway.close()
