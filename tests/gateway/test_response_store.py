"""Responses kept for previous_response_id in a gateway's memory: per key, bounded in time and number."""

from __future__ import annotations

from llmgw.gateway.response_store import ResponseStore

USER = {"type": "message", "role": "user", "content": "hi"}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}
RESPONSE = {"id": "resp_1", "object": "response", "output": [ANSWER]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_kept_response_gives_its_conversation_to_its_own_key_only() -> None:
    store = ResponseStore()
    await store.keep("resp_1", "key-a", [USER], [ANSWER], RESPONSE)
    kept = await store.get("resp_1", "key-a")
    assert kept is not None and kept.conversation() == [USER, ANSWER]
    assert kept.response == RESPONSE
    assert await store.get("resp_1", "key-b") is None


async def test_a_response_expires_after_its_time() -> None:
    clock = Clock()
    store = ResponseStore(ttl_s=60, clock=clock)
    await store.keep("resp_1", "key-a", [USER], [ANSWER], RESPONSE)
    clock.now = 59
    assert await store.get("resp_1", "key-a") is not None
    clock.now = 61
    assert await store.get("resp_1", "key-a") is None
    assert len(store) == 0


async def test_each_key_keeps_its_newest_responses_up_to_its_bound() -> None:
    store = ResponseStore(per_key=2)
    for n in range(3):
        await store.keep(f"resp_{n}", "key-a", [USER], [ANSWER], RESPONSE)
    await store.keep("resp_b", "key-b", [USER], [ANSWER], RESPONSE)
    assert await store.get("resp_0", "key-a") is None
    assert await store.get("resp_1", "key-a") is not None and await store.get("resp_2", "key-a") is not None
    assert await store.get("resp_b", "key-b") is not None


async def test_the_whole_store_is_bounded_oldest_first() -> None:
    store = ResponseStore(total=3)
    for n in range(5):
        await store.keep(f"resp_{n}", f"key-{n}", [USER], [ANSWER], RESPONSE)
    assert len(store) == 3
    assert await store.get("resp_1", "key-1") is None and await store.get("resp_4", "key-4") is not None


async def test_expired_responses_are_dropped_when_new_ones_come() -> None:
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    await store.keep("old", "key-a", [USER], [ANSWER], RESPONSE)
    clock.now = 20
    await store.keep("new", "key-a", [USER], [ANSWER], RESPONSE)
    assert len(store) == 1


async def test_a_key_deletes_its_own_response_only() -> None:
    store = ResponseStore()
    await store.keep("resp_1", "key-a", [USER], [ANSWER], RESPONSE)
    assert not await store.delete("resp_1", "key-b")
    assert await store.delete("resp_1", "key-a")
    assert await store.get("resp_1", "key-a") is None
    assert not await store.delete("resp_1", "key-a")
