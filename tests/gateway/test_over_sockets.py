"""The request path over real sockets: SDK -> uvicorn -> gateway -> its HTTP client -> an aiohttp engine.

The other gateway tests run on in-memory engines and an in-memory client;
these few keep every hop a real connection, for what only sockets show: a
stream relayed as the engine sends it, a client's close reaching the
engine as a dropped connection, a connection cut mid-answer, a closed port.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.controlplane.config import HttpSettings
from llmgw.controlplane.serving.httpserving import HttpServer
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, ReplicaEndpoint, hash_secret
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import RecordingOutbound
from llmgw.testing.serving import serving

from .conftest import MESSAGES, MODEL, SECRET, WAIT, FakeEngine, closed_port


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def gateway(hooks: RecordingOutbound) -> AsyncIterator[Gateway]:
    gw = Gateway(GatewaySettings(request_wait_s=0.3, retry_after_s=5), outbound=hooks)  # its HTTP client
    gw.keys.add(
        KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", Place(Owner.parse("user:alice")))
    )
    gw.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    yield gw
    await gw.close()


@pytest.fixture
async def url(gateway: Gateway) -> AsyncIterator[str]:
    async with serving(gateway.asgi_app()) as served:
        yield served


@pytest.fixture
async def client(url: str) -> AsyncIterator[AsyncOpenAI]:
    sdk = AsyncOpenAI(base_url=f"{url}/v1", api_key=SECRET, max_retries=0, timeout=WAIT * 2)
    yield sdk
    await sdk.close()


async def test_a_whole_answer_and_its_usage(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.replica_ready(engine.endpoint)
    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == "r1"
    assert engine.requests[0].headers["Authorization"] == f"Bearer {engine.key}"
    (record,) = await eventually(lambda: hooks.records)
    assert (record.prompt_tokens, record.completion_tokens, record.status) == (7, 3, 200)


async def test_a_stream_is_relayed_as_the_engine_sends_it(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    engine.hold_after_first = asyncio.Event()
    gateway.feed.replica_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    first = await asyncio.wait_for(anext(aiter(stream)), WAIT)  # while the engine holds the rest
    assert first.choices[0].delta.content == "r1-0 "
    engine.hold_after_first.set()
    rest = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert rest == ["r1-1 ", "r1-2 "]


async def test_a_client_closing_mid_stream_drops_the_engines_connection(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.hold_after_first = asyncio.Event()
    gateway.feed.replica_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    await asyncio.wait_for(anext(aiter(stream)), WAIT)
    await stream.close()
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    (record,) = await eventually(lambda: hooks.records)
    assert record.status == 499 and gateway.replicas.in_flight("r1") == 0


async def test_over_llmgws_server_a_clients_close_reaches_the_request_without_a_watcher_task(
    gateway: Gateway, engine: FakeEngine, hooks: RecordingOutbound
) -> None:
    """llmgw's HTTP server tells the request its connection is gone (gateway/leaving.py)."""
    server = HttpServer(gateway.asgi_app(), HttpSettings(port=0))
    serving_task = asyncio.create_task(server.serve_until_stopped())
    await server.listening.wait()
    engine.hold_after_first = asyncio.Event()
    gateway.feed.replica_ready(engine.endpoint)
    sdk = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=SECRET, max_retries=0)
    try:
        stream = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        await asyncio.wait_for(anext(aiter(stream)), WAIT)
        watchers = [t for t in asyncio.all_tasks() if "_wait_for_disconnect" in repr(t.get_coro())]
        await stream.close()
        await asyncio.wait_for(engine.dropped.wait(), WAIT)
        (record,) = await eventually(lambda: hooks.records)
    finally:
        await sdk.close()
        await server.stop()
        await serving_task
    assert watchers == []
    assert record.status == 499 and gateway.replicas.in_flight("r1") == 0


async def test_an_engine_cutting_its_stream_ends_it_with_an_error_event(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    engine.cut_after = 2
    gateway.feed.replica_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["r1-0 ", "r1-1 "]
    assert "failed mid-answer" in caught.value.message


async def test_a_closed_port_is_skipped_for_a_live_replica(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    dead = ReplicaEndpoint("dead", MODEL, f"http://127.0.0.1:{closed_port()}", "k", capacity=4)
    gateway.feed.replica_ready(dead)
    gateway.feed.replica_ready(engine.endpoint)
    with gateway.replicas.acquire(engine.endpoint):  # the live one looks busier: the dead one is tried first
        answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == "r1"
    assert [replica for replica, _ in hooks.failed] == ["dead"]


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/chat/completions"), ("GET", "/v1/models")])
async def test_two_authorization_headers_are_refused_400_not_one_of_them_taken(
    gateway: Gateway, engine: FakeEngine, url: str, method: str, path: str
) -> None:
    gateway.feed.replica_ready(engine.endpoint)
    bearer = f"Bearer {SECRET}"
    async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
        for second in (bearer, "Bearer sk-someone-else"):
            refused = await http.request(
                method,
                path,
                json={"model": MODEL, "messages": MESSAGES} if method == "POST" else None,
                headers=[("Authorization", bearer), ("Authorization", second)],
            )
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert error["code"] == "duplicate_authorization" and "send one" in error["message"]
    assert engine.requests == []


async def test_an_expired_key_lists_no_models_and_reads_nothing(gateway: Gateway, url: str) -> None:
    (key,) = list(gateway.keys)
    gateway.feed.keys_replaced([key])
    gateway.feed.limits_replaced({f"key:{key.key_id}": Limits(expires_s=1.0)})
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {SECRET}"}) as http:
        listed = ("/v1/files", "/v1/files/file-1/content", "/v1/batches", "/v1/responses/resp-1")
        for path in ("/v1/models", f"/v1/models/{MODEL}", *listed, "/v1/jobs/job-1"):
            refused = await http.get(path)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "expired_api_key"
        gateway.feed.limits_replaced({})
        assert (await http.get("/v1/models")).json()["data"][0]["id"] == MODEL


async def test_a_revoked_key_lists_no_models(gateway: Gateway, url: str) -> None:
    gateway.feed.keys_replaced([])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {SECRET}"}) as http:
        refused = await http.get("/v1/models")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


async def test_a_body_trickled_after_a_valid_keys_head_is_answered_408(gateway: Gateway) -> None:
    """The control plane's HTTP server in front: the gateway waits for the body, the edge times it."""
    settings = HttpSettings(port=0, body_window_s=0.2, body_min_bytes_per_s=1024, body_timeout_s=1.0)
    server = HttpServer(gateway.asgi_app(), settings)
    serving_task = asyncio.create_task(server.serve_until_stopped())
    await server.listening.wait()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{" % SECRET.encode()
    )

    async def trickle() -> None:
        while True:
            writer.write(b" " * 10)
            await asyncio.sleep(0.05)  # the client's pace: 200 bytes/s

    trickling = asyncio.create_task(trickle())
    try:
        got = await asyncio.wait_for(reader.read(65536), WAIT)
    finally:
        trickling.cancel()
        writer.close()
        await server.stop()
        await serving_task
    assert got.startswith(b"HTTP/1.1 408")
    error = json.loads(got.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert server.guard.slow_bodies == 1
