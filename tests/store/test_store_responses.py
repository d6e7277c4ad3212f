"""Kept responses in the store: each key's own, bounded per key and in all, never read once expired."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.errors import StoreError
from llmgw.store import Store
from llmgw.store.access import Executes
from llmgw.store.responses import TRIMMED_PER_KEEP, T
from llmgw.testing.clock import FakeClock

USER = {"type": "message", "role": "user", "content": "hi"}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}
TTL_S = 3600.0


def _response(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": "completed", "output": [ANSWER]}


async def _keep(store: Store, response_id: str, key_id: str = "key-a", *, per_key: int = 100) -> None:
    await store.responses.keep(
        response_id, key_id, [USER], [ANSWER], _response(response_id), ttl_s=TTL_S, per_key=per_key
    )


async def test_a_kept_response_is_read_back_whole_by_its_key(store: Store) -> None:
    await _keep(store, "resp_1")
    kept = await store.responses.get("resp_1", "key-a")
    assert kept is not None
    assert (kept.input_items, kept.output_items) == ([USER], [ANSWER])
    assert kept.response == _response("resp_1")
    assert (kept.expires_at - kept.kept_at).total_seconds() == TTL_S


async def test_another_key_neither_reads_nor_deletes_it(store: Store) -> None:
    await _keep(store, "resp_1")
    assert await store.responses.get("resp_1", "key-b") is None
    assert not await store.responses.delete("resp_1", "key-b")
    assert await store.responses.get("resp_1", "key-a") is not None


async def test_its_key_deletes_it_once(store: Store) -> None:
    await _keep(store, "resp_1")
    assert await store.responses.delete("resp_1", "key-a")
    assert await store.responses.get("resp_1", "key-a") is None
    assert not await store.responses.delete("resp_1", "key-a")


async def test_keeping_an_id_again_replaces_it(store: Store) -> None:
    await _keep(store, "resp_1")
    await store.responses.keep("resp_1", "key-a", [], [], {"id": "resp_1", "v": 2}, ttl_s=TTL_S, per_key=10)
    kept = await store.responses.get("resp_1", "key-a")
    assert kept is not None and kept.response == {"id": "resp_1", "v": 2}
    assert await store.responses.count() == 1


async def test_an_expired_response_is_never_read_nor_deleted(store: Store, clock: FakeClock) -> None:
    await _keep(store, "resp_1")
    await clock.advance(TTL_S - 1)
    assert await store.responses.get("resp_1", "key-a") is not None
    await clock.advance(2)
    assert await store.responses.get("resp_1", "key-a") is None
    assert not await store.responses.delete("resp_1", "key-a")


async def test_a_keep_deletes_expired_rows_a_bounded_number_at_a_time(store: Store, clock: FakeClock) -> None:
    for n in range(TRIMMED_PER_KEEP + 4):
        await _keep(store, f"old_{n}", f"key-{n}")
        await clock.advance(0.001)
    await clock.advance(TTL_S)
    await _keep(store, "new_1")
    assert await store.responses.count() == 4 + 1
    await _keep(store, "new_2")
    assert await store.responses.count() == 2


async def test_each_key_keeps_its_newest_up_to_per_key(store: Store, clock: FakeClock) -> None:
    for n in range(4):
        await _keep(store, f"resp_{n}", per_key=3)
        await clock.advance(1)
    await _keep(store, "theirs", "key-b", per_key=3)
    assert await store.responses.get("resp_0", "key-a") is None
    for n in (1, 2, 3):
        assert await store.responses.get(f"resp_{n}", "key-a") is not None
    assert await store.responses.get("theirs", "key-b") is not None


async def test_the_sweep_removes_the_expired_and_the_oldest_past_the_total(
    store: Store, clock: FakeClock
) -> None:
    for n in range(5):
        await _keep(store, f"live_{n}", f"key-{n}")
        await clock.advance(1)
    for n in range(3):
        await store.responses.keep(f"short_{n}", "key-s", [USER], [ANSWER], {}, ttl_s=10, per_key=10)
    await clock.advance(20)
    assert await store.responses.sweep(total=3) == 3 + 2
    assert await store.responses.count() == 3
    assert await store.responses.get("live_1", "key-1") is None
    for n in (2, 3, 4):
        assert await store.responses.get(f"live_{n}", f"key-{n}") is not None
    assert await store.responses.sweep(total=3) == 0


def _row(response_id: str, clock_now: Any) -> dict[str, Any]:
    return {
        "response_id": response_id,
        "key_id": "key-a",
        "input_items": [],
        "output_items": [],
        "response": {},
        "kept_at": clock_now,
        "expires_at": clock_now,
    }


async def test_a_transaction_is_committed_whole_or_rolled_back_whole(store: Store) -> None:
    row = _row("resp_1", store.now())

    def fails_after_writing(db: Executes) -> None:
        db.execute(T.insert(), row)
        raise ValueError("changed its mind")

    with pytest.raises(ValueError):
        await store.transact(fails_after_writing)
    assert await store.responses.count() == 0
    await store.transact(lambda db: db.execute(T.insert(), row))
    assert await store.responses.count() == 1
    with pytest.raises(StoreError):  # the driver's error, translated
        await store.transact(lambda db: db.execute(T.insert(), row))
