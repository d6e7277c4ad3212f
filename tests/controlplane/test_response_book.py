"""Kept responses on the store as the gateway asks for them, and the leader's sweep of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.serving.responsebook import ResponseSweeper, StoreResponseBook
from llmgw.errors import StoreUnavailable
from llmgw.gateway.api_errors import ApiError
from llmgw.store import Store
from llmgw.testing.clock import FakeClock

USER = {"type": "message", "role": "user", "content": "hi"}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", clock=clock) as store:
        yield store


async def test_the_book_gives_back_what_it_kept_for_its_key(store: Store) -> None:
    book = StoreResponseBook(store.responses, ttl_s=60, per_key=10)
    response = {"id": "resp_1", "object": "response", "output": [ANSWER]}
    await book.keep("resp_1", "key-a", [USER], [ANSWER], response)
    kept = await book.get("resp_1", "key-a")
    assert kept is not None
    assert kept.conversation() == [USER, ANSWER] and kept.response == response
    assert await book.get("resp_1", "key-b") is None
    assert not await book.delete("resp_1", "key-b")
    assert await book.delete("resp_1", "key-a")
    assert await book.get("resp_1", "key-a") is None


class _Unreachable:
    """A store's responses that cannot be reached."""

    def __init__(self) -> None:
        self.tries = 0

    async def get(self, response_id: str, key_id: str) -> None:
        raise StoreUnavailable("the store at test cannot be reached")

    async def delete(self, response_id: str, key_id: str) -> bool:
        raise StoreUnavailable("the store at test cannot be reached")

    async def sweep(self, total: int) -> int:
        self.tries += 1
        raise StoreUnavailable("the store at test cannot be reached")


async def test_a_store_that_cannot_be_reached_answers_503_to_retry() -> None:
    book = StoreResponseBook(_Unreachable())  # type: ignore[arg-type]
    for asking in (book.get("resp_1", "key-a"), book.delete("resp_1", "key-a")):
        with pytest.raises(ApiError) as caught:
            await asking
        assert caught.value.status == 503 and caught.value.code == "responses_unavailable"
        assert caught.value.retry_after is not None


async def test_the_sweeper_removes_expired_responses_and_those_past_the_total(
    store: Store, clock: FakeClock
) -> None:
    book = StoreResponseBook(store.responses, ttl_s=10, per_key=10)
    await book.keep("old", "key-a", [USER], [ANSWER], {})
    await clock.advance(20)
    for n in range(3):
        await book.keep(f"resp_{n}", "key-b", [USER], [ANSWER], {})
        await clock.advance(1)
    await store.responses.keep("expired_later", "key-c", [], [], {}, ttl_s=1, per_key=10)
    await clock.advance(2)
    sweeper = ResponseSweeper(store.responses, total=2, every_s=30, sleep=clock.sleep)
    running = asyncio.get_running_loop().create_task(sweeper.run())
    try:
        for _ in range(50):
            if await store.responses.count() == 2:
                break
            await asyncio.sleep(0.01)
        assert await store.responses.count() == 2
        assert await book.get("resp_0", "key-b") is None and await book.get("resp_2", "key-b") is not None
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_the_sweeper_carries_on_through_a_store_outage(clock: FakeClock) -> None:
    unreachable = _Unreachable()
    sweeper = ResponseSweeper(unreachable, total=2, every_s=30, sleep=clock.sleep)  # type: ignore[arg-type]
    running = asyncio.get_running_loop().create_task(sweeper.run())
    try:
        await asyncio.sleep(0)
        await clock.advance(30)
        await clock.advance(30)
        assert unreachable.tries == 3 and not running.done()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
