"""When a response is kept: before the client is sent the end of its answer, never with store: false."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from llmgw.core.tenancy import Owner, Place
from llmgw.errors import StoreUnavailable
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.response_store import ResponseStore
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream

from .conftest import MODEL, SECRET, WAIT, memory_sdk

TRANSLATED, NATIVE = "sglang", "llama.cpp"


class HeldBook(ResponseStore):
    """A book in memory whose keeps wait for :attr:`release` (a slow store), or fail."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.keeping = asyncio.Event()
        self.fails = False

    async def keep(
        self,
        response_id: str,
        key_id: str,
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
        response: dict[str, Any],
    ) -> None:
        self.keeping.set()
        await self.release.wait()
        if self.fails:
            raise StoreUnavailable("the store at test did not answer within 5 s")
        await super().keep(response_id, key_id, input_items, output_items, response)


@pytest.fixture
def book() -> HeldBook:
    return HeldBook()


@pytest.fixture
def upstream() -> MemoryUpstream:
    return MemoryUpstream(GatewaySettings(request_wait_s=0.3))


@pytest.fixture
async def engine(upstream: MemoryUpstream) -> AsyncIterator[MemoryEngine]:
    memory = upstream.engine(MemoryEngine())
    yield memory
    await memory.stop()


@pytest.fixture
async def gateway(book: HeldBook, upstream: MemoryUpstream, engine: MemoryEngine) -> AsyncIterator[Gateway]:
    gw = Gateway(upstream.settings, upstream=upstream, responses=book)
    gw.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), None, Place(Owner.parse("user:alice"))))
    gw.catalog.replace([ModelEntry(MODEL)])
    gw.replicas.set_ready(engine.endpoint_for(MODEL, engine=TRANSLATED))
    yield gw
    await gw.close()


def _served_by(gateway: Gateway, engine: MemoryEngine, engine_name: str) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, engine=engine_name))


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[AsyncOpenAI]:
    async with memory_sdk(gateway.asgi_app()) as sdk:
        yield sdk


@pytest.mark.parametrize("engine_name", [TRANSLATED, NATIVE])
async def test_a_stream_s_completed_event_is_sent_only_once_the_response_is_kept(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, book: HeldBook, engine_name: str
) -> None:
    _served_by(gateway, engine, engine_name)
    stream = await client.responses.create(model=MODEL, input="hi", stream=True)
    seen: list[str] = []

    async def read() -> None:
        async for event in stream:
            seen.append(event.type)

    reading = asyncio.get_running_loop().create_task(read())
    await asyncio.wait_for(book.keeping.wait(), WAIT)
    await asyncio.sleep(0.05)  # room for events sent too early to arrive
    assert "response.completed" not in seen
    book.release.set()
    await asyncio.wait_for(reading, WAIT)
    assert seen[-1] == "response.completed"
    assert len(book) == 1


@pytest.mark.parametrize("engine_name", [TRANSLATED, NATIVE])
async def test_a_whole_response_is_answered_once_it_is_kept(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, book: HeldBook, engine_name: str
) -> None:
    _served_by(gateway, engine, engine_name)
    asking = asyncio.get_running_loop().create_task(client.responses.create(model=MODEL, input="hi"))
    await asyncio.wait_for(book.keeping.wait(), WAIT)
    await asyncio.sleep(0.05)
    assert not asking.done()
    book.release.set()
    response = await asyncio.wait_for(asking, WAIT)
    kept = await book.get(response.id, "key-1")
    assert kept is not None and kept.response["id"] == response.id


@pytest.mark.parametrize("engine_name", [TRANSLATED, NATIVE])
@pytest.mark.parametrize("stream", [False, True])
async def test_store_false_keeps_nothing(
    gateway: Gateway,
    engine: MemoryEngine,
    client: AsyncOpenAI,
    book: HeldBook,
    engine_name: str,
    stream: bool,
) -> None:
    _served_by(gateway, engine, engine_name)
    book.release.set()
    if stream:
        events = [
            e async for e in await client.responses.create(model=MODEL, input="hi", store=False, stream=True)
        ]
        assert events[-1].type == "response.completed"
    else:
        response = await client.responses.create(model=MODEL, input="hi", store=False)
        assert response.store is False
    assert not book.keeping.is_set() and len(book) == 0


async def test_a_response_the_book_cannot_keep_is_answered_all_the_same(
    client: AsyncOpenAI, book: HeldBook
) -> None:
    book.fails = True
    book.release.set()
    response = await client.responses.create(model=MODEL, input="hi")
    assert response.output_text and len(book) == 0
