"""The catalog's adapters in the gateway: at-start ones on the replicas started with them, runtime
ones at each node's path."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from llmgw.core.catalog import parse_model
from llmgw.gateway import Gateway, KeyEntry, hash_secret
from llmgw.gateway.adapters import LOADS, AdapterEntry, AdapterLoadFailed, Adapters, adapter_entries
from llmgw.gateway.bodies import choosing_lora
from llmgw.gateway.catalog_view import GatewayCatalog, catalog_entries
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.upstream import Upstream
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import RecordingOutbound
from llmgw.testing.serving import serving

from .conftest import SECRET

SHA = "0123456789abcdef" * 4


async def _instant(seconds: float) -> None:
    return None


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Standin, str]]:
    settings = StandinSettings(
        engine="vllm", served_name="base", api_key="k", max_loras=2, runtime_lora=True, startup_s=0
    )
    standin = Standin(settings, sleep=_instant)
    runner = web.AppRunner(build_app(standin))
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield standin, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _registry(url: str) -> tuple[Adapters, Upstream]:
    table = ReplicaTable()
    table.set_ready(ReplicaEndpoint("r0", "base", url, "k", capacity=8, engine="vllm"))
    upstream = Upstream(GatewaySettings())
    return Adapters(table, upstream), upstream


async def test_a_runtime_adapter_loads_from_the_path_its_replicas_node_reported(
    engine: tuple[Standin, str],
) -> None:
    standin, url = engine
    adapters, upstream = _registry(url)
    adapters.replace([AdapterEntry("sql", "base", max_loaded=2)])
    adapters.set_paths("r0", {"sql": "/node/weights/aa"})
    assert await adapters.place("sql", b"req") is not None
    assert dict(standin.adapters) == {"sql": "/node/weights/aa"}
    await upstream.close()


async def test_a_replica_that_reported_no_path_cannot_load(engine: tuple[Standin, str]) -> None:
    standin, url = engine
    adapters, upstream = _registry(url)
    adapters.register("sql", "base", max_loaded=2)
    adapters.set_paths("r0", {"sql": "/node/weights/aa"})
    adapters.forget("r0")  # restarted: what it reported is gone with it
    with pytest.raises(AdapterLoadFailed, match="reported no path for adapter sql"):
        await adapters.place("sql", b"req")
    assert not standin.adapters
    await upstream.close()


async def test_an_adapter_given_at_start_goes_to_a_replica_of_its_model_without_a_load(
    engine: tuple[Standin, str],
) -> None:
    standin, url = engine
    adapters, upstream = _registry(url)
    adapters.replace([AdapterEntry("sql", "base")])
    adapters.set_paths("r0", {"sql": "/node/weights/sql.gguf"})  # its engine was started with it
    loads = LOADS.labels("base")._value.get()
    endpoint = await adapters.place("sql", b"req")
    assert endpoint is not None and endpoint.replica_id == "r0"
    assert not standin.adapters and LOADS.labels("base")._value.get() == loads
    assert adapters.residency("base") is None
    await upstream.close()


async def test_a_replica_started_without_an_at_start_adapter_is_never_chosen_for_it(
    engine: tuple[Standin, str],
) -> None:
    _, url = engine
    adapters, upstream = _registry(url)  # r0 was started before the adapter was added
    adapters.table.set_ready(ReplicaEndpoint("r1", "base", url, "k", capacity=8, engine="vllm"))
    adapters.replace([AdapterEntry("sql", "base")])
    adapters.set_paths("r0", {})
    assert await adapters.place("sql", b"req") is None  # nobody holds it yet
    assert not adapters.servable("sql")
    adapters.set_paths("r1", {"sql": "/node/weights/sql.gguf"})
    chosen = []
    for _ in range(20):  # r1 grows busier each time, r0 stays idle: the load never sends it to r0
        endpoint = await adapters.place("sql", b"req")
        assert endpoint is not None
        chosen.append(endpoint.replica_id)
        adapters.table.acquire(endpoint)
    assert set(chosen) == {"r1"} and adapters.servable("sql")
    plain = adapters.table.pick("base")  # the model itself: the idle r0
    assert plain is not None and plain.replica_id == "r0"
    await upstream.close()


def _tone_gateway(url: str, request_wait_s: float) -> Gateway:
    gateway = Gateway(GatewaySettings(request_wait_s=request_wait_s, retry_after_s=3))
    gateway.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice"))
    model = parse_model(
        {"name": "base", "source": {"sha256": SHA}, "adapters": [{"name": "tone", "sha256": SHA}]}
    )
    gateway.feed.catalog_replaced([model])
    old = ReplicaEndpoint("r-old", "base", url, "k", capacity=8, engine="vllm")
    gateway.feed.replica_ready(old, {})  # started before the adapter was added
    return gateway


TONE = {"model": "tone", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_an_at_start_adapters_request_waits_for_a_replica_holding_it(
    engine: tuple[Standin, str],
) -> None:
    standin, url = engine
    standin.adapters["tone"] = "/node/tone.gguf"  # the new replica's engine, started with it
    gateway = _tone_gateway(url, request_wait_s=5)
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with serving(gateway.asgi_app()) as base, aiohttp.ClientSession() as http:
        asking = asyncio.create_task(http.post(f"{base}/v1/chat/completions", json=TONE, headers=headers))
        await eventually(lambda: gateway.replicas.model_load("base").waiting == 1,
                         message="the request waits for a replica holding the adapter")  # fmt: skip
        assert not asking.done() and not standin.requests
        fresh = ReplicaEndpoint("r-new", "base", url, "k", capacity=8, engine="vllm")
        gateway.feed.replica_ready(fresh, {"tone": "/node/tone.gguf"})
        async with asyncio.timeout(5):
            response = await asking
        assert response.status == 200
        response.release()
        assert standin.requests == 1 and gateway.replicas.model_load("base").waiting == 0
    await gateway.close()


async def test_an_at_start_adapter_no_ready_replica_holds_answers_503_saying_so(
    engine: tuple[Standin, str],
) -> None:
    standin, url = engine
    gateway = _tone_gateway(url, request_wait_s=0.05)
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with serving(gateway.asgi_app()) as base, aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=TONE, headers=headers) as response:
            error = (await response.json())["error"]
            assert response.status == 503 and response.headers["Retry-After"] == "3"
        assert error["code"] == "model_not_ready"
        assert "No ready replica of model 'base' holds adapter 'tone' yet" in error["message"]
        assert standin.requests == 0  # the old replica, the plain base model, never got it
        plain = {**TONE, "model": "base"}
        async with http.post(f"{base}/v1/chat/completions", json=plain, headers=headers) as response:
            assert response.status == 200  # the model itself is served there as before
    await gateway.close()


def test_replacing_the_adapters_forgets_those_gone_and_their_models_residency() -> None:
    adapters = Adapters(ReplicaTable(), Upstream(GatewaySettings()))
    adapters.replace([AdapterEntry("sql", "base", max_loaded=1), AdapterEntry("tone", "small")])
    assert [e.name for e in adapters.entries()] == ["sql", "tone"]
    assert adapters.residency("base") is not None
    adapters.replace([AdapterEntry("tone", "small")])
    assert adapters.get("sql") is None and adapters.residency("base") is None


def test_the_catalog_lists_adapters_with_their_parent_owner_and_demand() -> None:
    model = parse_model(
        {
            "name": "small",
            "source": {"sha256": SHA},
            "replicas": {"min": 0},
            "on_demand": True,
            "owner": "team:acme/a",
            "adapters": [{"name": "tone", "sha256": SHA}],
        }
    )
    catalog = GatewayCatalog(catalog_entries([model]))
    listed = json.loads(catalog.listing())["data"]
    assert listed == [
        {"id": "small", "object": "model", "created": 0, "owned_by": "team:acme/a", "serves": "chat"},
        {
            "id": "tone",
            "object": "model",
            "created": 0,
            "owned_by": "team:acme/a",
            "parent": "small",
            "serves": "chat",
        },
    ]
    entry = catalog.get("tone")
    assert entry is not None and entry.on_demand


async def test_an_adapters_request_waits_for_its_model_to_start_on_demand(
    engine: tuple[Standin, str],
) -> None:
    standin, url = engine
    outbound = RecordingOutbound()
    wanted = outbound.wanted
    gateway = Gateway(GatewaySettings(request_wait_s=5), outbound=outbound)
    gateway.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice"))
    model = parse_model(
        {"name": "base", "source": {"sha256": SHA}, "replicas": {"min": 0}, "on_demand": True,
         "adapters": [{"name": "tone", "sha256": SHA}]}
    )  # fmt: skip
    gateway.catalog.replace(catalog_entries([model]))
    gateway.adapters.replace([AdapterEntry("tone", "base")])
    body = {"model": "tone", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    standin.adapters["tone"] = "/node/tone.gguf"  # the engine was given it at start
    async with serving(gateway.asgi_app()) as base, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {SECRET}"}
        asking = asyncio.create_task(http.post(f"{base}/v1/chat/completions", json=body, headers=headers))
        await eventually(lambda: wanted, message="the gateway wants a replica of the base model")
        assert wanted == ["base"] and not asking.done()
        endpoint = ReplicaEndpoint("r0", "base", url, "k", capacity=8, engine="vllm")
        gateway.feed.replica_ready(endpoint, {"tone": "/node/tone.gguf"})
        async with asyncio.timeout(5):
            response = await asking
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == " tok0 tok1"
        response.release()
    await gateway.close()


def test_llamacpp_requests_name_their_adapter_by_id_and_the_model_alone_turns_all_off() -> None:
    model = parse_model(
        {"name": "small", "source": {"sha256": SHA},
         "adapters": [{"name": "half", "sha256": SHA, "scale": 0.5}, {"name": "full", "sha256": SHA}]}
    )  # fmt: skip
    adapters = Adapters(ReplicaTable(), Upstream(GatewaySettings()))
    adapters.replace(adapter_entries([model]))
    assert json.loads(adapters.lora_choice("half") or b"") == [{"id": 0, "scale": 0.5}]
    assert json.loads(adapters.lora_choice("full") or b"") == [{"id": 1, "scale": 1.0}]
    assert json.loads(adapters.lora_choice("small") or b"") == [{"id": 0, "scale": 0.0}]
    assert adapters.lora_choice("other") is None


def test_vllm_adapters_need_no_lora_field() -> None:
    config = {"sha256": SHA, "filename": "adapter_config.json"}
    model = parse_model(
        {"name": "base", "source": {"sha256": SHA, "format": "safetensors"}, "profile": {"engine": "vllm"},
         "adapters": [{"name": "sql", "sha256": SHA, "files": [config]}]}
    )  # fmt: skip
    adapters = Adapters(ReplicaTable(), Upstream(GatewaySettings()))
    adapters.replace(adapter_entries([model]))
    assert adapters.lora_choice("sql") is None and adapters.lora_choice("base") is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"m"}', {"model": "m", "lora": [{"id": 1, "scale": 1.0}]}),
        (b"  {}", {"lora": [{"id": 1, "scale": 1.0}]}),
        (b'{"model":"m","lora":[{"id":0,"scale":2}]}', {"model": "m", "lora": [{"id": 1, "scale": 1.0}]}),
    ],
    ids=["spliced", "empty-object", "replaced"],
)
def test_the_lora_field_is_set_whatever_the_client_sent(body: bytes, expected: dict[str, object]) -> None:
    assert json.loads(choosing_lora(body, b'[{"id":1,"scale":1.0}]')) == expected
