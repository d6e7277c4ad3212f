"""Knowledge at request time: collections searched, passages in the prompt, sources in the answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.knowledge import cache_salt
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry
from llmgw.gateway.keys import hash_secret
from llmgw.gateway.knowledge import HEADER, MAX_COLLECTIONS, MAX_LIMIT
from llmgw.testing.knowledge import InMemoryKnowledge

from .conftest import AUTH, MODEL, SECRET, MemoryEngine, memory_sdk

OTHER_SECRET = "sk-llmgw-other-team-0123456789"
DEFAULTS_SECRET = "sk-llmgw-defaults-0123456789"
ALICE = Owner.parse("user:alice")
BOB = Owner.parse("user:bob")
HANDBOOK = {"handbook.md": ["Holidays are booked in the portal.", "Expenses are paid monthly."]}
RUNBOOK = {"runbook.md": ["Restart the gateway with llmgw restart."]}


@pytest.fixture
def knowledge(gateway: Gateway) -> InMemoryKnowledge:
    search = InMemoryKnowledge()
    search.add("handbook", ALICE, HANDBOOK)
    search.add("runbook", BOB, RUNBOOK)
    gateway.knowledge = search
    gateway.keys.add(KeyEntry("key-2", "bob", hash_secret(OTHER_SECRET), "user:bob", Place(BOB)))
    gateway.keys.add(
        KeyEntry("key-3", "alice-d", hash_secret(DEFAULTS_SECRET), "", Place(ALICE), ("handbook",))
    )
    return search


def _sent(engine: MemoryEngine) -> dict[str, Any]:
    return json.loads(engine.requests[-1].body)  # type: ignore[no-any-return]


def _ask(collections: list[str], limit: int | None = None) -> dict[str, Any]:
    field: dict[str, Any] = {"collections": collections}
    if limit is not None:
        field["limit"] = limit
    return {"knowledge": field}


async def test_passages_go_into_the_prompt_and_sources_come_back_with_the_answer(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(engine="vllm"))
    answer = await client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "How are holidays booked?"},
        ],
        extra_body=_ask(["handbook"], 1),
    )
    sources = (answer.model_extra or {})["sources"]
    assert sources == [
        {
            "collection": "handbook",
            "document": "handbook.md",
            "position": 0,
            "score": 3 / 4,
            "text": "Holidays are booked in the portal.",
        }
    ]
    assert answer.choices[0].message.content == engine.replica_id
    sent = _sent(engine)
    assert "knowledge" not in sent
    assert sent["messages"][0] == {
        "role": "system",
        "content": f"Be brief.\n\n{HEADER}\n\n[1] handbook.md (collection handbook, passage 0)\n"
        "Holidays are booked in the portal.",
    }
    assert sent["messages"][1] == {"role": "user", "content": "How are holidays booked?"}
    assert sent["cache_salt"] == cache_salt(["handbook"])
    assert knowledge.searches[-1][1:] == (("handbook",), "How are holidays booked?", 1)


async def test_without_a_system_message_one_is_put_first(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "expenses?"}], extra_body=_ask(["handbook"])
    )
    messages = _sent(engine)["messages"]
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith(HEADER)
    assert (
        "[1] handbook.md (collection handbook, passage 1)\nExpenses are paid monthly."
        in messages[0]["content"]
    )
    assert messages[1] == {"role": "user", "content": "expenses?"}


async def test_cache_salt_goes_only_to_engines_that_take_it(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(engine="llama.cpp"))
    await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "holidays"}],
        extra_body={**_ask(["handbook"]), "cache_salt": "the-clients-own"},
    )
    assert "cache_salt" not in _sent(engine)


async def test_a_request_without_collections_is_forwarded_as_sent(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(engine="vllm"))
    raw = b'{"model": "tiny-chat",  "messages": [{"role": "user", "content": "hi"}]}'
    response = await http.post("/v1/chat/completions", content=raw, headers=AUTH)
    answer = response.json()
    assert response.status_code == 200 and "sources" not in answer
    assert engine.requests[-1].body == raw
    assert knowledge.searches == []


async def test_a_stream_carries_the_sources_in_its_first_chunk(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "holidays"}],
        stream=True,
        extra_body=_ask(["handbook"]),
    )
    chunks = [chunk async for chunk in stream]
    first = chunks[0].model_extra or {}
    assert [s["document"] for s in first["sources"]] == ["handbook.md"]
    assert all("sources" not in (c.model_extra or {}) for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "r1-0 r1-1 r1-2 "


async def test_responses_get_the_passages_in_instructions_and_sources_back(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(engine="vllm"))  # serves Responses itself
    response = await client.responses.create(
        model=MODEL,
        input="how are holidays booked",
        instructions="Be brief.",
        extra_body=_ask(["handbook"], 1),
    )
    assert [s["text"] for s in (response.model_extra or {})["sources"]] == [
        "Holidays are booked in the portal."
    ]
    sent = _sent(engine)
    assert engine.requests[-1].path == "/v1/responses"
    assert sent["instructions"].startswith(f"Be brief.\n\n{HEADER}\n\n[1] handbook.md")
    assert sent["cache_salt"] == cache_salt(["handbook"]) and "knowledge" not in sent


async def test_a_translated_response_stream_carries_sources_in_response_created(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(engine="sglang"))  # answers chat: translated
    stream = await client.responses.create(
        model=MODEL, input="holidays", stream=True, extra_body=_ask(["handbook"])
    )
    events = [event async for event in stream]
    assert events[0].type == "response.created"
    assert [s["collection"] for s in (events[0].model_extra or {})["sources"]] == ["handbook"]
    sent = _sent(engine)
    assert engine.requests[-1].path == "/v1/chat/completions"
    assert sent["messages"][0]["content"].startswith(HEADER)
    assert sent["cache_salt"] == cache_salt(["handbook"])


async def test_a_keys_default_collections_are_searched_when_the_request_names_none(
    gateway: Gateway, engine: MemoryEngine, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    async with memory_sdk(gateway.asgi_app(), DEFAULTS_SECRET) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "holidays"}]
        )
        assert [s["document"] for s in (answer.model_extra or {})["sources"]] == ["handbook.md"]
    assert knowledge.searches[-1][1] == ("handbook",)


async def test_a_collection_the_key_may_not_read_answers_as_one_that_does_not_exist(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    bodies = []
    for collection in ("handbook", "no-such"):  # alice's, then none; asked by bob
        request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **_ask([collection])}
        headers = {"Authorization": f"Bearer {OTHER_SECRET}"}
        response = await http.post("/v1/chat/completions", json=request, headers=headers)
        assert response.status_code == 404
        bodies.append(response.json()["error"])
    unreadable, unknown = bodies
    assert unreadable["code"] == unknown["code"] == "collection_not_found"
    assert unreadable["message"].replace("handbook", "X") == unknown["message"].replace("no-such", "X")
    assert unreadable["param"] == "knowledge.collections"
    assert engine.requests == []


async def test_the_search_runs_after_the_keys_limits_are_taken(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", Place(ALICE))])
    gateway.feed.limits_replaced({"key:key-1": Limits(requests_per_minute=3, concurrent=1)})
    unknown = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **_ask(["no-such"])}
    for _ in range(2):  # a refused search frees the request's concurrent slot
        response = await http.post("/v1/chat/completions", json=unknown, headers=AUTH)
        assert response.status_code == 404
    request = {**unknown, **_ask(["handbook"])}
    response = await http.post("/v1/chat/completions", json=request, headers=AUTH)
    assert response.status_code == 200
    searched = len(knowledge.searches)
    response = await http.post("/v1/chat/completions", json=request, headers=AUTH)
    assert response.status_code == 429  # over the key's rate: refused before anything is searched
    assert len(knowledge.searches) == searched == 3 and len(engine.requests) == 1


@pytest.mark.parametrize(
    ("knowledge_field", "param"),
    [
        (["handbook"], "knowledge"),
        ({"collections": "handbook"}, "knowledge.collections"),
        ({"collections": []}, "knowledge.collections"),
        ({"collections": [""]}, "knowledge.collections"),
        ({"collections": [3]}, "knowledge.collections"),
        ({"collections": [f"c{i}" for i in range(MAX_COLLECTIONS + 1)]}, "knowledge.collections"),
        ({"collections": ["handbook"], "limit": 0}, "knowledge.limit"),
        ({"collections": ["handbook"], "limit": MAX_LIMIT + 1}, "knowledge.limit"),
        ({"collections": ["handbook"], "limit": True}, "knowledge.limit"),
        ({"collections": ["handbook"], "top": 3}, "knowledge.top"),
    ],
)
async def test_bad_shapes_answer_400_naming_the_field(
    gateway: Gateway,
    engine: MemoryEngine,
    client: AsyncOpenAI,
    knowledge: InMemoryKnowledge,
    knowledge_field: Any,
    param: str,
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"knowledge": knowledge_field},
        )
    assert caught.value.code == "invalid_knowledge"
    assert caught.value.param == param
    assert knowledge.searches == [] and engine.requests == []


async def test_completions_and_requests_without_user_text_answer_400(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model=MODEL, prompt="hi", extra_body=_ask(["handbook"]))
    assert caught.value.param == "knowledge" and "/v1/chat/completions" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "hi"}], extra_body=_ask(["handbook"])
        )
    assert caught.value.param == "messages"


async def test_a_failing_search_answers_503_with_what_to_do(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, knowledge: InMemoryKnowledge
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    knowledge.failing = ConnectionError("the embedding model has no ready replica")
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=_ask(["handbook"])
        )
    assert caught.value.status_code == 503
    assert caught.value.code == "knowledge_unavailable"
    assert (
        "embedding model has no ready replica" in caught.value.message
        and "Retry in 5 s" in caught.value.message
    )
    assert caught.value.response.headers["retry-after"] == "5"
    assert engine.requests == []


async def test_without_a_search_a_request_naming_collections_answers_503(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=_ask(["handbook"])
        )
    assert caught.value.status_code == 503 and caught.value.code == "knowledge_unavailable"
    body = caught.value.body
    assert isinstance(body, dict) and "without 'knowledge'" in body["hint"]


async def test_without_a_search_a_relay_answers_requests_naming_collections(
    gateway: Gateway, engine: MemoryEngine
) -> None:
    """A gateway worker hands such a request whole to its control plane's gateway, which searches."""
    plane = gateway
    search = InMemoryKnowledge()
    search.add("handbook", ALICE, HANDBOOK)
    plane.knowledge = search
    plane.replicas.set_ready(engine.endpoint)
    worker = Gateway(plane.settings, keys=plane.keys, catalog=plane.catalog, replicas=plane.replicas)
    worker.knowledge_relay = plane.asgi_app()
    try:
        async with memory_sdk(worker.asgi_app()) as sdk:
            answer = await sdk.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "holidays"}],
                extra_body=_ask(["handbook"]),
            )
    finally:
        await worker.close()
    assert [s["document"] for s in (answer.model_extra or {})["sources"]] == ["handbook.md"]
    assert len(search.searches) == 1
