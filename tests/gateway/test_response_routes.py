"""Kept responses through the openai SDK: retrieve, delete, input_items.list; a key's own only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry
from llmgw.gateway.keys import hash_secret

from .conftest import AUTH, MODEL, MemoryEngine, memory_sdk

OTHER_SECRET = "sk-llmgw-other-0123456789"


@pytest.fixture
async def ready(gateway: Gateway, engine: MemoryEngine) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))


@pytest.fixture
async def other(gateway: Gateway) -> AsyncIterator[AsyncOpenAI]:
    """The SDK as another key (another user)."""
    gateway.keys.add(
        KeyEntry("key-2", "other", hash_secret(OTHER_SECRET), "user:bob", Place(Owner.parse("user:bob")))
    )
    async with memory_sdk(gateway.asgi_app(), OTHER_SECRET) as sdk:
        yield sdk


@pytest.mark.usefixtures("ready")
async def test_a_response_is_retrieved_as_it_was_answered(client: AsyncOpenAI) -> None:
    made = await client.responses.create(model=MODEL, input="hi", metadata={"run": "1"})
    again = await client.responses.retrieve(made.id)
    assert again.model_dump() == made.model_dump()
    assert again.output_text == "r1" and again.metadata == {"run": "1"}


@pytest.mark.usefixtures("ready")
async def test_a_streamed_response_is_retrieved_completed(client: AsyncOpenAI) -> None:
    events = [event async for event in await client.responses.create(model=MODEL, input="hi", stream=True)]
    done = events[-1].response  # type: ignore[union-attr]
    again = await client.responses.retrieve(done.id)
    assert again.status == "completed" and again.output_text == done.output_text


@pytest.mark.usefixtures("ready")
async def test_a_deleted_response_is_gone_for_reads_and_follow_ups(
    client: AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    made = await client.responses.create(model=MODEL, input="hi")
    answer = await http.delete(f"/v1/responses/{made.id}", headers=AUTH)
    assert answer.status_code == 200
    assert answer.json() == {"id": made.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as caught:
        await client.responses.retrieve(made.id)
    assert caught.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(made.id)
    with pytest.raises(openai.BadRequestError) as follow_up:
        await client.responses.create(model=MODEL, input="more", previous_response_id=made.id)
    assert follow_up.value.code == "previous_response_not_found"


@pytest.mark.usefixtures("ready")
async def test_the_sdk_deletes_a_response(client: AsyncOpenAI) -> None:
    made = await client.responses.create(model=MODEL, input="hi")
    assert await client.responses.delete(made.id) is None  # the SDK's return type
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(made.id)


@pytest.mark.usefixtures("ready")
async def test_another_key_s_response_answers_as_one_never_made(
    client: AsyncOpenAI, other: AsyncOpenAI
) -> None:
    made = await client.responses.create(model=MODEL, input="hi")
    never = "resp_never"
    for response_id in (made.id, never):
        with pytest.raises(openai.NotFoundError) as caught:
            await other.responses.retrieve(response_id)
        assert caught.value.code == "response_not_found"
        with pytest.raises(openai.NotFoundError):
            await other.responses.delete(response_id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.input_items.list(response_id)
    assert (await client.responses.retrieve(made.id)).id == made.id


@pytest.mark.usefixtures("ready")
async def test_a_response_sent_with_store_false_cannot_be_read_back(client: AsyncOpenAI) -> None:
    made = await client.responses.create(model=MODEL, input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(made.id)


@pytest.mark.usefixtures("ready")
async def test_input_items_are_the_whole_conversation_newest_first(client: AsyncOpenAI) -> None:
    first = await client.responses.create(model=MODEL, input="My name is Ada.")
    second = await client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id
    )
    page = await client.responses.input_items.list(second.id)
    items = [item.model_dump() for item in page.data]
    assert [(item["type"], item["role"]) for item in items] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert [(part["type"], part["text"]) for part in items[0]["content"]] == [
        ("input_text", "What is my name?")
    ]
    assert items[1]["id"] == first.output[0].id
    assert page.has_more is False
    ascending = await client.responses.input_items.list(second.id, order="asc")
    assert [item.id for item in ascending.data] == [item["id"] for item in reversed(items)]
    again = await client.responses.input_items.list(second.id)
    assert [item.id for item in again.data] == [item["id"] for item in items]  # ids stay the same


@pytest.mark.usefixtures("ready")
async def test_input_items_come_in_pages_after_an_item(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    history = [{"role": "user", "content": f"line {n}"} for n in range(5)]
    made = await client.responses.create(model=MODEL, input=history)  # type: ignore[arg-type]
    first = (await http.get(f"/v1/responses/{made.id}/input_items?limit=2&order=asc", headers=AUTH)).json()
    assert first["object"] == "list" and first["has_more"] is True
    assert [item["content"][0]["text"] for item in first["data"]] == ["line 0", "line 1"]
    assert (first["first_id"], first["last_id"]) == (first["data"][0]["id"], first["data"][1]["id"])
    texts = [
        item.content[0].text  # type: ignore[union-attr]
        async for item in client.responses.input_items.list(made.id, limit=2, order="asc")
    ]
    assert texts == [f"line {n}" for n in range(5)]
    last = await client.responses.input_items.list(made.id, order="asc", after=first["last_id"], limit=100)
    assert len(last.data) == 3 and last.has_more is False


@pytest.mark.usefixtures("ready")
@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("order=up", "order"),
        ("after=x", "after"),
    ],
)
async def test_a_bad_list_parameter_answers_400_naming_it(
    client: AsyncOpenAI, http: httpx.AsyncClient, query: str, param: str
) -> None:
    made = await client.responses.create(model=MODEL, input="hi")
    answer = await http.get(f"/v1/responses/{made.id}/input_items?{query}", headers=AUTH)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


@pytest.mark.usefixtures("ready")
async def test_other_methods_answer_405_naming_those_taken(
    client: AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    made = await client.responses.create(model=MODEL, input="hi")
    answer = await http.put(f"/v1/responses/{made.id}", headers=AUTH)
    assert answer.status_code == 405 and answer.headers["allow"] == "GET, DELETE"
    answer = await http.delete(f"/v1/responses/{made.id}/input_items", headers=AUTH)
    assert answer.status_code == 405 and answer.headers["allow"] == "GET"
    assert (await http.get(f"/v1/responses/{made.id}/else", headers=AUTH)).status_code == 404


async def test_reading_a_response_needs_a_key(http: httpx.AsyncClient) -> None:
    answer = await http.get("/v1/responses/resp_1")
    assert answer.status_code == 401
