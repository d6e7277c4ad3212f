"""Two gateways on one store (two processes serving /v1): each answers the other's follow-ups and reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.controlplane.serving.responsebook import StoreResponseBook
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.store import Store
from llmgw.testing.asgi_client import StreamingAsgiTransport
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream

MODEL = "tiny-chat"
SECRET = "sk-llmgw-shared-0123456789"
ENGINES = ["sglang", "llama.cpp"]
"""One that answers chat completions (llmgw makes the Response), one serving the Responses API."""


@pytest.fixture
def upstream() -> MemoryUpstream:
    return MemoryUpstream(GatewaySettings(request_wait_s=0.3))


@pytest.fixture
async def engine(upstream: MemoryUpstream) -> AsyncIterator[MemoryEngine]:
    """The one replica both gateways reach."""
    memory = upstream.engine(MemoryEngine())
    yield memory
    await memory.stop()


async def _gateway(path: Path, upstream: MemoryUpstream) -> tuple[Gateway, Store]:
    store = await Store.open(f"sqlite+aiosqlite:///{path}")  # each process opens the store itself
    gateway = Gateway(upstream.settings, upstream=upstream, responses=StoreResponseBook(store.responses))
    gateway.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), None, Place(Owner.parse("user:alice"))))
    gateway.catalog.replace([ModelEntry(MODEL)])
    return gateway, store


@pytest.fixture
async def gateways(tmp_path: Path, upstream: MemoryUpstream) -> AsyncIterator[tuple[Gateway, Gateway]]:
    path = tmp_path / "store.db"
    (one, first), (two, second) = [await _gateway(path, upstream) for _ in range(2)]
    yield one, two
    for gateway, store in ((one, first), (two, second)):
        await gateway.close()
        await store.close()


def _sdk(gateway: Gateway) -> AsyncOpenAI:
    url = "http://gateway.test/v1"
    http = httpx.AsyncClient(transport=StreamingAsgiTransport(gateway.asgi_app()), base_url=url, timeout=10)
    return AsyncOpenAI(base_url=url, api_key=SECRET, max_retries=0, http_client=http)


@pytest.fixture
async def sdks(gateways: tuple[Gateway, Gateway]) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI]]:
    async with _sdk(gateways[0]) as one, _sdk(gateways[1]) as two:
        yield one, two


def _serve(gateways: tuple[Gateway, Gateway], engine: MemoryEngine, engine_name: str) -> None:
    for gateway in gateways:
        gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine=engine_name))


def _last_conversation(engine: MemoryEngine) -> list[tuple[str, str]]:
    """The roles and texts of the conversation the last request carried to the engine."""
    body = json.loads(engine.requests[-1].body)
    if "messages" in body:
        return [(m["role"], m["content"]) for m in body["messages"]]
    conversation = []
    for item in body["input"]:
        content = item["content"]
        text = content if isinstance(content, str) else "".join(part["text"] for part in content)
        conversation.append((item["role"], text))
    return conversation


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_a_follow_up_on_the_other_gateway_continues_the_conversation(
    gateways: tuple[Gateway, Gateway],
    sdks: tuple[AsyncOpenAI, AsyncOpenAI],
    engine: MemoryEngine,
    engine_name: str,
) -> None:
    _serve(gateways, engine, engine_name)
    one, two = sdks
    first = await one.responses.create(model=MODEL, input="My name is Ada.")
    second = await two.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
    assert [role for role, _ in _last_conversation(engine)] == ["user", "assistant", "user"]
    assert _last_conversation(engine)[0] == ("user", "My name is Ada.")
    third = await one.responses.create(model=MODEL, input="And again?", previous_response_id=second.id)
    assert len(_last_conversation(engine)) == 5 and third.status == "completed"


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_a_streamed_response_is_continued_on_the_other_gateway_the_moment_it_completed(
    gateways: tuple[Gateway, Gateway],
    sdks: tuple[AsyncOpenAI, AsyncOpenAI],
    engine: MemoryEngine,
    engine_name: str,
) -> None:
    _serve(gateways, engine, engine_name)
    one, two = sdks
    stream = await one.responses.create(model=MODEL, input="My name is Ada.", stream=True)
    async for event in stream:
        if event.type == "response.completed":
            # the stream is not read to its end: the follow-up goes as soon as the client sees it
            follow_up = await two.responses.create(
                model=MODEL, input="What is my name?", previous_response_id=event.response.id, stream=True
            )
            events = [e async for e in follow_up]
            assert events[-1].type == "response.completed"
    assert [role for role, _ in _last_conversation(engine)] == ["user", "assistant", "user"]


async def test_a_response_is_read_listed_and_deleted_on_the_other_gateway(
    gateways: tuple[Gateway, Gateway], sdks: tuple[AsyncOpenAI, AsyncOpenAI], engine: MemoryEngine
) -> None:
    _serve(gateways, engine, "sglang")
    one, two = sdks
    made = await one.responses.create(model=MODEL, input="hi")
    assert (await two.responses.retrieve(made.id)).model_dump() == made.model_dump()
    assert [item.type for item in (await two.responses.input_items.list(made.id)).data] == ["message"]
    await two.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await one.responses.retrieve(made.id)


@pytest.mark.parametrize("stream", [False, True])
async def test_store_false_keeps_nothing_for_either_gateway(
    gateways: tuple[Gateway, Gateway],
    sdks: tuple[AsyncOpenAI, AsyncOpenAI],
    engine: MemoryEngine,
    stream: bool,
) -> None:
    _serve(gateways, engine, "sglang")
    one, two = sdks
    if stream:
        events = [
            e async for e in await one.responses.create(model=MODEL, input="hi", store=False, stream=True)
        ]
        response_id = events[-1].response.id  # type: ignore[union-attr]
    else:
        response_id = (await one.responses.create(model=MODEL, input="hi", store=False)).id
    for sdk in (one, two):
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(response_id)
        with pytest.raises(openai.BadRequestError):
            await sdk.responses.create(model=MODEL, input="more", previous_response_id=response_id)
