"""Responses, embeddings and rerank through the gateway, asserted with the openai SDK and raw HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry
from llmgw.gateway.keys import hash_secret
from llmgw.testing.eventually import eventually

from .conftest import AUTH, EMBED, MODEL, RERANK, MemoryEngine, RecordingOutbound, memory_sdk

OTHER_SECRET = "sk-llmgw-other-0123456789"


def _bodies(engine: MemoryEngine, path: str) -> list[dict[str, object]]:
    return [json.loads(r.body) for r in engine.requests if r.path == path]


async def test_a_chat_model_asked_for_embeddings_answers_400_naming_what_it_serves(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=MODEL, input="hi")
    assert caught.value.code == "model_not_supported"
    assert "serves chat" in caught.value.message and "serves: embeddings" in caught.value.message
    assert engine.requests == []


async def test_an_embedding_model_is_not_sent_chat(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(EMBED))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
    assert "serves embeddings" in caught.value.message
    assert engine.requests == []


async def test_models_say_what_each_serves(client: AsyncOpenAI) -> None:
    served = {model.id: model.model_extra["serves"] async for model in client.models.list()}  # type: ignore[index]
    assert served[MODEL] == "chat" and served[EMBED] == "embeddings" and served[RERANK] == "rerank"


@pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
async def test_rerank_is_forwarded_to_the_engines_rerank_route_and_counted(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound, route: str
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(RERANK))
    request = {"model": RERANK, "query": "capital of France", "documents": ["Paris", "Berlin"]}
    response = await http.post(route, json=request, headers=AUTH)
    answer = response.json()
    assert response.status_code == 200
    assert [r["index"] for r in answer["results"]] == [0, 1]
    assert [r.path for r in engine.requests] == ["/v1/rerank"]
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].prompt_tokens == 6


async def test_an_engine_that_cannot_do_what_is_asked_answers_400_not_5xx(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(EMBED))
    engine.error = (
        501,
        b'{"error":{"code":501,"message":"start it with --embeddings","type":"not_supported_error"}}',
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=EMBED, input="hi")
    assert "--embeddings" in caught.value.message


async def test_a_response_from_an_engine_without_the_api_is_translated_from_a_chat_completion(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))
    response = await client.responses.create(
        model=MODEL, instructions="Be brief.", input="hi", max_output_tokens=20, temperature=0.2
    )
    assert response.output_text == "r1"
    assert response.status == "completed" and response.model == MODEL
    assert response.usage is not None and (response.usage.input_tokens, response.usage.output_tokens) == (
        7,
        3,
    )
    (sent,) = _bodies(engine, "/v1/chat/completions")
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert (sent["max_tokens"], sent["temperature"]) == (20, 0.2)
    await eventually(lambda: hooks.records, message="the usage was told")
    assert (hooks.records[0].prompt_tokens, hooks.records[0].completion_tokens) == (7, 3)


async def test_a_translated_response_streams_the_typed_events_in_order(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="trtllm"))
    stream = await client.responses.create(model=MODEL, input="hi", stream=True)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4:7] == ["response.output_text.delta"] * 3
    assert kinds[7:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == "r1-0 r1-1 r1-2 "
    assert done.usage is not None and done.usage.output_tokens == 3


async def test_a_follow_up_carries_the_earlier_conversation_to_the_engine(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))
    first = await client.responses.create(model=MODEL, input="My name is Ada.")
    await client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
    second = _bodies(engine, "/v1/chat/completions")[1]
    assert second["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "r1"},
        {"role": "user", "content": "What is my name?"},
    ]


async def test_a_response_is_kept_for_its_own_key_only_and_not_at_all_with_store_false(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))
    gateway.keys.add(
        KeyEntry("key-2", "other", hash_secret(OTHER_SECRET), "user:bob", Place(Owner.parse("user:bob")))
    )
    kept = await client.responses.create(model=MODEL, input="hi")
    unkept = await client.responses.create(model=MODEL, input="hi", store=False)
    other = memory_sdk(gateway.asgi_app(), OTHER_SECRET)
    with pytest.raises(openai.BadRequestError) as caught:
        await other.responses.create(model=MODEL, input="more", previous_response_id=kept.id)
    assert caught.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model=MODEL, input="more", previous_response_id=unkept.id)
    await other.close()


async def test_a_native_engine_is_sent_the_whole_conversation_and_keeps_nothing_itself(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="llama.cpp"))
    first = await client.responses.create(model=MODEL, input="one")
    assert first.output_text == "r1" and first.model == MODEL
    await client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    sent = _bodies(engine, "/v1/responses")
    assert all(body["store"] is False and "previous_response_id" not in body for body in sent)
    assert [item.get("role") for item in sent[1]["input"]] == ["user", "assistant", "user"]  # type: ignore[union-attr]


async def test_a_translated_stream_the_replica_drops_ends_with_a_responses_error_event(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))
    engine.cut_after = 1
    stream = await client.responses.create(model=MODEL, input="hi", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "error"
    assert events[-1].code == "upstream_disconnected"  # type: ignore[union-attr]
    assert "completed" not in {event.type for event in events}


async def test_a_hosted_tool_is_refused_for_a_translated_engine(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])
    assert "function tools" in caught.value.message
    assert engine.requests == []
