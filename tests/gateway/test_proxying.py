"""Requests through a real uvicorn to a real (fake) engine, asserted with the openai SDK."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from openai import AsyncOpenAI

from llmgw.gateway import Gateway, ReplicaEndpoint
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream

from .conftest import (
    EMBED,
    LAZY,
    MESSAGES,
    MODEL,
    SECRET,
    WAIT,
    RecordingOutbound,
    memory_sdk,
)

NOWHERE = "http://127.0.0.1:1"
"""An address no in-memory engine answers at: unreachable, as a closed port."""


async def test_chat_completion_is_answered_by_the_replica(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == "r1"
    assert answer.usage is not None and answer.usage.total_tokens == 10


async def test_the_replica_gets_its_own_key_the_request_id_and_the_body_as_sent(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        extra_headers={"x-request-id": "req-42"},
    )
    assert raw.headers["x-request-id"] == "req-42"
    seen = engine.requests[0]
    assert seen.headers["Authorization"] == "Bearer replica-key-r1"
    assert seen.headers["x-request-id"] == "req-42"
    assert SECRET not in repr(seen.headers)
    assert json.loads(seen.body) == {"model": MODEL, "messages": MESSAGES}


async def test_completions_and_embeddings_are_forwarded(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    gateway.replicas.set_ready(engine.endpoint_for(EMBED))
    completion = await client.completions.create(model=MODEL, prompt="hi")
    embedding = await client.embeddings.create(model=EMBED, input="hi")
    assert completion.choices[0].text == "r1"
    assert embedding.data[0].embedding == [0.5, -0.25]
    assert [r.path for r in engine.requests] == ["/v1/completions", "/v1/embeddings"]


async def test_a_stream_arrives_chunk_by_chunk(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    chunks = aiter(stream)
    # The first chunk reaches the client while the engine still holds back the rest.
    first = await asyncio.wait_for(anext(chunks), WAIT)
    assert first.choices[0].delta.content == "r1-0 "
    engine.hold_after_first.set()
    rest = [chunk async for chunk in chunks]
    texts = [c.choices[0].delta.content for c in rest if c.choices]
    assert texts == ["r1-1 ", "r1-2 "]


async def test_usage_is_reported_for_a_whole_answer(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await eventually(lambda: hooks.records, message="the usage was told")
    (record,) = hooks.records
    assert (record.key_id, record.model, record.replica_id) == ("key-1", MODEL, "r1")
    assert (record.prompt_tokens, record.completion_tokens, record.status) == (7, 3, 200)
    assert record.duration_s > 0


async def test_usage_is_read_from_the_last_event_of_a_stream(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks = 5
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    async for _ in stream:
        pass
    await eventually(lambda: hooks.records, message="the usage was told")
    (record,) = hooks.records
    assert (record.prompt_tokens, record.completion_tokens, record.status) == (7, 5, 200)


async def test_no_ready_replica_asks_for_one_then_answers_503_with_retry_after(
    client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=LAZY, messages=MESSAGES)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "5"
    assert caught.value.code == "model_not_ready"
    assert "Retry in 5 s" in caught.value.message
    assert hooks.wanted == [LAZY]


@pytest.mark.parametrize("settings", [{"request_wait_s": WAIT}], indirect=True)
async def test_a_request_waits_for_a_replica_started_on_demand(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    ready = ReplicaEndpoint("r-lazy", LAZY, engine.endpoint.base_url, engine.key)
    asking = asyncio.create_task(client.chat.completions.create(model=LAZY, messages=MESSAGES))
    await eventually(lambda: hooks.wanted == [LAZY], message="the gateway asks for a replica")
    gateway.feed.replica_ready(ready)  # as the control plane does once one started
    answer = await asyncio.wait_for(asking, WAIT)
    assert answer.choices[0].message.content == "r1"
    assert hooks.wanted == [LAZY]
    assert gateway.replicas.in_flight("r-lazy") == 0


async def test_client_leaving_mid_stream_drops_the_engine_connection(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    await asyncio.wait_for(anext(aiter(stream)), WAIT)
    await stream.close()
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].status == 499
    assert gateway.replicas.in_flight("r1") == 0


async def test_client_leaving_while_the_answer_is_computed_drops_the_engine_connection(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    request = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=MESSAGES))
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    request.cancel()
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    with pytest.raises(asyncio.CancelledError):
        await request


async def test_a_stream_cut_by_the_engine_ends_with_an_error_event(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.cut_after = 2
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["r1-0 ", "r1-1 "]
    assert "failed mid-answer" in caught.value.message
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].status == 502


async def test_the_least_loaded_replica_takes_the_next_request(
    gateway: Gateway, upstream: MemoryUpstream, client: AsyncOpenAI
) -> None:
    busy = upstream.engine(MemoryEngine("busy", "key-busy"))
    idle = upstream.engine(MemoryEngine("idle", "key-idle"))
    busy.hold = asyncio.Event()
    try:
        gateway.replicas.set_ready(busy.endpoint)
        gateway.replicas.set_ready(idle.endpoint)
        # Both idle: the first request goes to one of them; make sure "busy" holds it.
        gateway.replicas.remove("idle")
        held = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=MESSAGES))
        await asyncio.wait_for(busy.arrived.wait(), WAIT)
        gateway.replicas.set_ready(idle.endpoint)
        for _ in range(3):
            answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
            assert answer.choices[0].message.content == "idle"
        busy.hold.set()
        assert (await held).choices[0].message.content == "busy"
    finally:
        await busy.stop()
        await idle.stop()


async def test_a_dead_replica_is_skipped_for_a_live_one(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    dead = ReplicaEndpoint("dead", MODEL, NOWHERE, "k", capacity=4)
    gateway.replicas.set_ready(dead)
    gateway.replicas.set_ready(engine.endpoint)
    with gateway.replicas.acquire(engine.endpoint):  # the live one looks busier: the dead one is tried first
        answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == "r1"
    assert [replica for replica, _ in hooks.failed] == ["dead"]
    assert gateway.replicas.in_flight("dead") == 0


async def test_no_reachable_replica_answers_503_replica_unavailable(
    gateway: Gateway, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    for name in ("dead-1", "dead-2"):
        gateway.replicas.set_ready(ReplicaEndpoint(name, MODEL, NOWHERE, "k"))
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.status_code == 503
    assert caught.value.code == "replica_unavailable"
    assert caught.value.response.headers["retry-after"] == "5"
    assert sorted(replica for replica, _ in hooks.failed) == ["dead-1", "dead-2"]


@pytest.mark.parametrize("settings", [{"request_wait_s": 60.0}], indirect=True)
async def test_client_leaving_while_waiting_for_a_replica_ends_the_wait(gateway: Gateway) -> None:
    sdk = memory_sdk(gateway.asgi_app())
    request = asyncio.create_task(sdk.chat.completions.create(model=LAZY, messages=MESSAGES))
    await eventually(lambda: gateway.feed.model_load(LAZY).waiting == 1, message="the request waits")
    request.cancel()
    await eventually(lambda: gateway.feed.model_load(LAZY).waiting == 0, message="the wait ended")
    await sdk.close()
