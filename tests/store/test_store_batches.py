"""Batches in the store: a batch and its requests, each answered once, carried on by any leader."""

from __future__ import annotations

import pytest

from llmgw.core.batches import BatchLine, BatchStatus
from llmgw.errors import Conflict, NotFound
from llmgw.store import Store
from llmgw.testing.clock import FakeClock


async def _batch(store: Store, batch_id: str = "batch_1", owner: str = "project:acme/ml/chat") -> None:
    await store.batches.add(
        batch_id=batch_id,
        owner=owner,
        key_id="k1",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        window_s=86400,
        metadata={"job": "nightly"},
    )


def _lines(count: int) -> list[BatchLine]:
    return [BatchLine(i, f"req-{i}", {"model": "m", "messages": []}) for i in range(count)]


async def test_a_new_batch_is_validating_with_its_window(store: Store, clock: FakeClock) -> None:
    await _batch(store)
    batch = await store.batches.get("batch_1")
    assert batch.status is BatchStatus.VALIDATING
    assert (batch.expires_at - batch.created_at).total_seconds() == 86400
    shown = batch.as_openai()
    assert shown["object"] == "batch" and shown["metadata"] == {"job": "nightly"}
    assert shown["request_counts"] == {"total": 0, "completed": 0, "failed": 0}


async def test_an_unknown_batch_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.batches.get("batch_nope")


async def test_each_request_is_answered_once_and_counted(store: Store) -> None:
    await _batch(store)
    await store.batches.add_requests("batch_1", _lines(3))
    await store.batches.move("batch_1", BatchStatus.IN_PROGRESS)
    line = {"custom_id": "req-1", "response": {"status_code": 200}}
    assert await store.batches.answer("batch_1", 1, ok=True, result=line, input_tokens=5, output_tokens=2)
    assert not await store.batches.answer("batch_1", 1, ok=False, result={"custom_id": "req-1"})
    batch = await store.batches.get("batch_1")
    assert (batch.total, batch.completed, batch.failed) == (3, 1, 0)
    assert (batch.input_tokens, batch.output_tokens) == (5, 2)
    assert [p.custom_id for p in await store.batches.pending("batch_1", 10)] == ["req-0", "req-2"]
    assert await store.batches.results("batch_1") == [("done", line)]


async def test_requests_written_again_by_a_later_leader_are_not_doubled(store: Store) -> None:
    await _batch(store)
    await store.batches.add_requests("batch_1", _lines(3))
    await store.batches.add_requests("batch_1", _lines(3))
    assert (await store.batches.get("batch_1")).total == 3
    assert len(await store.batches.pending("batch_1", 10)) == 3


async def test_statuses_move_only_forward(store: Store, clock: FakeClock) -> None:
    await _batch(store)
    await store.batches.move("batch_1", BatchStatus.IN_PROGRESS)
    await clock.advance(5)
    await store.batches.move("batch_1", BatchStatus.CANCELLING)
    with pytest.raises(Conflict):
        await store.batches.move("batch_1", BatchStatus.COMPLETED)
    cancelled = await store.batches.move("batch_1", BatchStatus.CANCELLED, output_file_id="file-out")
    shown = cancelled.as_openai()
    assert shown["cancelled_at"] - shown["in_progress_at"] == 5
    assert shown["output_file_id"] == "file-out"
    with pytest.raises(Conflict):
        await store.batches.move("batch_1", BatchStatus.IN_PROGRESS)


async def test_a_place_lists_its_own_batches_newest_first_a_page_at_a_time(
    store: Store, clock: FakeClock
) -> None:
    for i in range(3):
        await _batch(store, f"batch_{i}")
        await clock.advance(1)
    await _batch(store, "batch_other", owner="project:acme/ml/other")
    page, more = await store.batches.list("project:acme/ml/chat", limit=2)
    assert [b.id for b in page] == ["batch_2", "batch_1"] and more
    page, more = await store.batches.list("project:acme/ml/chat", after="batch_1", limit=2)
    assert [b.id for b in page] == ["batch_0"] and not more
    with pytest.raises(NotFound):
        await store.batches.list("project:acme/ml/chat", after="batch_other")


async def test_unended_batches_are_what_a_leader_runs(store: Store) -> None:
    await _batch(store, "batch_a")
    await _batch(store, "batch_b")
    await store.batches.move("batch_b", BatchStatus.FAILED, errors=[{"code": "x", "message": "y"}])
    assert [b.id for b in await store.batches.unended()] == ["batch_a"]


async def test_ended_batches_are_removed_after_a_while(store: Store, clock: FakeClock) -> None:
    await _batch(store, "batch_a")
    await store.batches.add_requests("batch_a", _lines(2))
    await store.batches.move("batch_a", BatchStatus.FAILED)
    await _batch(store, "batch_b")
    await clock.advance(10)
    assert await store.batches.delete_ended_before(store.now()) == 1
    with pytest.raises(NotFound):
        await store.batches.get("batch_a")
    assert (await store.batches.get("batch_b")).status is BatchStatus.VALIDATING
