"""Under failure the client always gets an answer: a client leaving frees the engine, a failing
replica gives a clear error, a silent one a timeout, never a hang."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.gateway import Gateway, GatewaySettings
from llmgw.testing.eventually import eventually

from .conftest import AUTH, MESSAGES, MODEL, WAIT, MemoryEngine, RecordingOutbound

SILENCE_S = 0.5


@pytest.fixture
def settings() -> GatewaySettings:
    return GatewaySettings(request_wait_s=0.3, upstream_timeout_s=SILENCE_S)


async def test_client_leaving_a_stream_before_its_first_event_drops_the_engine_connection(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    engine.hold = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True})

    async def ask() -> None:
        await http.post("/v1/chat/completions", content=body, headers=AUTH)

    request = asyncio.create_task(ask())
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    request.cancel()
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].status == 499
    assert gateway.replicas.in_flight("r1") == 0


async def test_a_replica_dropping_the_request_gives_a_clear_error(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.abort_on_arrival = True
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(client.chat.completions.create(model=MODEL, messages=MESSAGES), WAIT)
    assert caught.value.status_code == 502  # it was in flight there: a bad gateway, not a missing replica
    assert "dropped the request before answering" in caught.value.message
    assert caught.value.response.headers["retry-after"] == "5"
    assert [replica for replica, _ in hooks.failed] == ["r1"]
    assert gateway.replicas.in_flight("r1") == 0


async def test_a_replica_failing_halfway_through_a_whole_answer_gives_a_clear_error(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.cut_whole = True
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(client.chat.completions.create(model=MODEL, messages=MESSAGES), WAIT)
    assert caught.value.status_code == 502
    assert "dropped the connection" in caught.value.message
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].status == 502


async def test_a_replica_silent_before_its_answer_gives_a_timeout(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(client.chat.completions.create(model=MODEL, messages=MESSAGES), WAIT)
    assert caught.value.status_code == 504


async def test_a_replica_silent_mid_stream_ends_the_stream_with_a_timeout_event(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = []

    async def read() -> None:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)

    with pytest.raises(openai.APIError) as caught:
        await asyncio.wait_for(read(), WAIT)
    assert received == ["r1-0 "]
    assert "stopped sending" in caught.value.message
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].status == 504
