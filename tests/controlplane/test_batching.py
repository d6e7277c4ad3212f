"""Batches run by the leader: through the gateway on spare capacity, each request answered once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from llmgw.controlplane.serving.batchbook import StoreBatchBook
from llmgw.controlplane.serving.batching import BatchRunner, BatchSettings
from llmgw.core.batches import BatchStatus
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import ModelEntry
from llmgw.gateway.app import Gateway
from llmgw.gateway.keys import KeyEntry, hash_secret
from llmgw.gateway.settings import GatewaySettings
from llmgw.store import Store
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MODEL, MemoryEngine, MemoryUpstream

PLACE = "project:acme/ml/chat"
KEY = KeyEntry("key-1", "batch", hash_secret("sk-batch"), None, Place(Owner.parse(PLACE)))
OTHER = KeyEntry("key-2", "other", hash_secret("sk-other"), None, Place(Owner.parse("project:acme/ml/other")))
QUICK = BatchSettings(share=0.5, most_at_once=4, look_s=0.005, retry_s=0.05, poll_s=0.02)


class MemoryBatchFiles:
    """Batch input files by (owner, id), and the outputs written."""

    def __init__(self) -> None:
        self.inputs: dict[tuple[str, str], bytes] = {}
        self.outputs: dict[str, tuple[str, str, bytes]] = {}

    async def is_batch_input(self, owner: str, file_id: str) -> bool:
        return (owner, file_id) in self.inputs

    async def batch_input(self, owner: str, file_id: str) -> bytes | None:
        return self.inputs.get((owner, file_id))

    async def write_output(self, owner: str, filename: str, data: bytes) -> str:
        file_id = f"file-out-{len(self.outputs)}"
        self.outputs[file_id] = (owner, filename, data)
        return file_id

    def lines(self, file_id: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.outputs[file_id][2].splitlines()]


def _requests(count: int, model: str = MODEL) -> bytes:
    return b"\n".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]},
            }
        ).encode()
        for i in range(count)
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", clock=clock) as opened:
        yield opened


@pytest.fixture
async def engine() -> AsyncIterator[tuple[MemoryUpstream, MemoryEngine]]:
    upstream = MemoryUpstream(GatewaySettings(request_wait_s=0.2))
    memory = upstream.engine(MemoryEngine())
    yield upstream, memory
    await memory.stop()


@pytest.fixture
async def gateway(engine: tuple[MemoryUpstream, MemoryEngine]) -> AsyncIterator[Gateway]:
    upstream, memory = engine
    gw = Gateway(GatewaySettings(request_wait_s=0.2), upstream=upstream)
    gw.keys.add(KEY)
    gw.keys.add(OTHER)
    gw.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    gw.replicas.set_ready(memory.endpoint)
    yield gw
    await gw.close()


@pytest.fixture
def files() -> MemoryBatchFiles:
    return MemoryBatchFiles()


@pytest.fixture
def book(store: Store, files: MemoryBatchFiles) -> StoreBatchBook:
    return StoreBatchBook(store.batches, files)


async def _create(book: StoreBatchBook, files: MemoryBatchFiles, data: bytes, key: KeyEntry = KEY) -> str:
    files.inputs[(str(key.place.at), "file-in")] = data
    made = await book.create(
        key, input_file_id="file-in", endpoint="/v1/chat/completions", completion_window="24h", metadata=None
    )
    assert made["status"] == "validating"
    return str(made["id"])


async def _run_until_ended(runner: BatchRunner, store: Store, batch_id: str) -> Any:
    task = asyncio.create_task(runner.run())
    try:
        return await eventually(
            lambda: _ended(store, batch_id), timeout_s=10, message=f"batch {batch_id} ends"
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _ended(store: Store, batch_id: str) -> Any:
    batch = await store.batches.get(batch_id)
    return batch if batch.status.ended else None


def _runner(
    store: Store,
    files: MemoryBatchFiles,
    gateway: Gateway,
    settings: BatchSettings = QUICK,
    loads: Any = None,
) -> BatchRunner:
    return BatchRunner(
        store.batches, files, gateway.asgi_app(), gateway.keys, gateway.replicas, store.now, settings, loads
    )


async def test_a_batch_is_answered_through_the_gateway_every_request_once_in_order(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    batch_id = await _create(book, files, _requests(10))
    batch = await _run_until_ended(_runner(store, files, gateway), store, batch_id)
    assert batch.status is BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (10, 10, 0)
    lines = files.lines(batch.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(10)]
    assert {line["response"]["status_code"] for line in lines} == {200}
    assert lines[0]["response"]["body"]["object"] == "chat.completion"
    assert len(engine[1].requests) == 10
    assert batch.input_tokens > 0 and batch.error_file_id == ""
    assert files.outputs[batch.output_file_id][0] == PLACE


async def test_a_leader_taking_a_batch_over_sends_only_what_is_pending(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    batch_id = await _create(book, files, _requests(6))
    from llmgw.core.batches import parse_input

    await store.batches.add_requests(batch_id, parse_input(_requests(6), "/v1/chat/completions"))
    await store.batches.move(batch_id, BatchStatus.IN_PROGRESS)
    for position in (0, 2, 4):  # what the last leader had answered before it died
        line = {"custom_id": f"req-{position}", "response": {"status_code": 200, "body": {"kept": True}}}
        await store.batches.answer(batch_id, position, ok=True, result=line)
    batch = await _run_until_ended(_runner(store, files, gateway), store, batch_id)
    assert (batch.completed, batch.failed) == (6, 0)
    assert len(engine[1].requests) == 3
    lines = files.lines(batch.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(6)]
    assert [bool(line["response"]["body"].get("kept")) for line in lines] == [True, False] * 3


async def test_a_bad_input_file_fails_the_batch_naming_the_line(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook
) -> None:
    batch_id = await _create(book, files, _requests(2) + b"\n{broken")
    batch = await _run_until_ended(_runner(store, files, gateway), store, batch_id)
    assert batch.status is BatchStatus.FAILED
    assert batch.errors[0]["line"] == 3 and "not JSON" in batch.errors[0]["message"]
    assert batch.as_openai()["errors"]["data"][0]["code"] == "invalid_request"


async def test_a_request_the_engine_refuses_is_kept_in_the_error_file(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    batch_id = await _create(book, files, _requests(3, model="no-such-model"))
    batch = await _run_until_ended(_runner(store, files, gateway), store, batch_id)
    assert batch.status is BatchStatus.COMPLETED
    assert (batch.completed, batch.failed, batch.output_file_id) == (0, 3, "")
    lines = files.lines(batch.error_file_id)
    assert {line["response"]["status_code"] for line in lines} == {404}
    assert lines[0]["response"]["body"]["error"]["code"] == "model_not_found"


async def test_batch_requests_wait_while_interactive_traffic_fills_the_share(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    memory = engine[1]
    gateway.replicas.set_engine_load(memory.replica_id, 2)  # 2 of 4 slots busy: the share (0.5) is full
    batch_id = await _create(book, files, _requests(2))
    task = asyncio.create_task(_runner(store, files, gateway).run())
    try:
        await eventually(lambda: _status(store, batch_id, BatchStatus.IN_PROGRESS))
        for _ in range(20):  # many looks at the headroom: none lets a request through
            await asyncio.sleep(QUICK.look_s)
        assert memory.requests == []
        gateway.replicas.set_engine_load(memory.replica_id, 0)
        batch = await eventually(lambda: _ended(store, batch_id), timeout_s=10)
        assert batch.completed == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class ScriptedLoads:
    """A load reader whose fresh reads find what the test says the engine runs now."""

    def __init__(self, gateway: Gateway, replica_id: str) -> None:
        self.table = gateway.replicas
        self.replica_id = replica_id
        self.engine_runs = 0
        self.reads = 0

    async def read_now(self, model: str) -> bool:
        self.reads += 1
        runs = self.engine_runs if not self.alternate else self.reads % 2
        self.table.set_engine_load(self.replica_id, runs)
        return True

    alternate = False
    """Each read finds the engine busy and idle by turns (a busy client's requests and the gaps between)."""


async def test_a_batch_reads_the_engine_afresh_and_holds_back_for_an_interactive_request_just_begun(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    memory = engine[1]
    gateway.replicas.set_engine_load(memory.replica_id, 0)  # the last interval's reading: idle
    loads = ScriptedLoads(gateway, memory.replica_id)
    loads.engine_runs = 1  # an interactive request began since that reading
    settings = replace(QUICK, share=0.25, fresh_s=0.0)
    batch_id = await _create(book, files, _requests(2))
    task = asyncio.create_task(_runner(store, files, gateway, settings, loads).run())
    try:
        await eventually(lambda: _status(store, batch_id, BatchStatus.IN_PROGRESS))
        await eventually(lambda: loads.reads >= 20, message="many fresh looks")
        assert memory.requests == [], "no batch request joins the interactive one on 4 slots at 0.25"
        loads.engine_runs = 0
        batch = await eventually(lambda: _ended(store, batch_id), timeout_s=10)
        assert batch.completed == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_batch_sends_nothing_while_reads_find_an_engine_idle_only_between_requests(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    memory = engine[1]
    loads = ScriptedLoads(gateway, memory.replica_id)
    loads.alternate = True
    settings = replace(QUICK, share=0.25, fresh_s=0.01)
    batch_id = await _create(book, files, _requests(2))
    task = asyncio.create_task(_runner(store, files, gateway, settings, loads).run())
    try:
        await eventually(lambda: _status(store, batch_id, BatchStatus.IN_PROGRESS))
        await eventually(lambda: loads.reads >= 40, message="many fresh looks")
        assert memory.requests == [], "one idle read between two busy ones lets no request through"
        loads.alternate, loads.engine_runs = False, 0
        batch = await eventually(lambda: _ended(store, batch_id), timeout_s=10)
        assert batch.completed == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _status(store: Store, batch_id: str, status: BatchStatus) -> bool:
    return (await store.batches.get(batch_id)).status is status


async def test_a_cancelled_batch_keeps_what_was_answered_and_answers_the_rest_cancelled(
    store: Store, files: MemoryBatchFiles, gateway: Gateway, book: StoreBatchBook, engine: Any
) -> None:
    memory = engine[1]
    memory.hold = asyncio.Event()
    batch_id = await _create(book, files, _requests(8))
    task = asyncio.create_task(_runner(store, files, gateway).run())
    try:
        await eventually(lambda: len(memory.requests) >= 2)
        cancelling = await book.cancel(KEY, batch_id)
        assert cancelling is not None and cancelling["status"] == "cancelling"
        memory.hold.set()
        batch = await eventually(lambda: _ended(store, batch_id), timeout_s=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert batch.status is BatchStatus.CANCELLED
    sent = len(memory.requests)
    assert 2 <= sent < 8 and (batch.completed, batch.failed) == (sent, 8 - sent)
    errors = files.lines(batch.error_file_id)
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


async def test_a_batch_past_its_window_expires_with_the_rest_unanswered(
    store: Store,
    files: MemoryBatchFiles,
    gateway: Gateway,
    book: StoreBatchBook,
    engine: Any,
    clock: FakeClock,
) -> None:
    memory = engine[1]
    memory.hold = asyncio.Event()
    batch_id = await _create(book, files, _requests(8))
    task = asyncio.create_task(_runner(store, files, gateway).run())
    try:
        await eventually(lambda: len(memory.requests) >= 1)
        await clock.advance(timedelta(hours=25).total_seconds())
        memory.hold.set()
        batch = await eventually(lambda: _ended(store, batch_id), timeout_s=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert batch.status is BatchStatus.EXPIRED
    assert batch.completed + batch.failed == 8 and batch.failed >= 1
    assert {line["error"]["code"] for line in files.lines(batch.error_file_id)} == {"batch_expired"}


async def test_a_batch_is_seen_only_by_keys_of_its_place(
    store: Store, files: MemoryBatchFiles, book: StoreBatchBook
) -> None:
    batch_id = await _create(book, files, _requests(1))
    assert (await book.get(KEY, batch_id) or {})["id"] == batch_id
    assert await book.get(OTHER, batch_id) is None
    assert await book.cancel(OTHER, batch_id) is None
    assert (await book.list(OTHER, None, 10)) == ([], False)
    listed, more = await book.list(KEY, None, 10)
    assert [b["id"] for b in listed] == [batch_id] and not more


async def test_a_batch_of_a_file_the_place_does_not_have_is_refused(
    files: MemoryBatchFiles, book: StoreBatchBook
) -> None:
    files.inputs[(PLACE, "file-in")] = _requests(1)
    from llmgw.gateway.api_errors import ApiError

    with pytest.raises(ApiError) as refused:
        await book.create(
            OTHER,
            input_file_id="file-in",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata=None,
        )
    assert refused.value.status == 400 and "purpose 'batch'" in str(refused.value)
