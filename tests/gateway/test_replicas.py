"""The replica table: ready replicas by model, least loaded first, waits without polling."""

from __future__ import annotations

import asyncio

from llmgw.gateway import ReplicaEndpoint, ReplicaTable
from llmgw.testing.clock import FakeClock


def replica(replica_id: str, model: str = "m", capacity: int = 1) -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id, model, f"http://{replica_id}:8000", "key", capacity)


def test_pick_takes_the_replica_with_the_lowest_share_in_use() -> None:
    table = ReplicaTable()
    small, large = replica("small", capacity=2), replica("large", capacity=8)
    table.set_ready(small)
    table.set_ready(large)
    leases = [table.acquire(small), table.acquire(large), table.acquire(large)]
    assert table.pick("m") == large  # 2/8 in use against 1/2
    for lease in leases:
        lease.release()


def test_idle_replicas_take_turns() -> None:
    table = ReplicaTable()
    for name in ("a", "b", "c"):
        table.set_ready(replica(name))
    picked = {table.pick("m").replica_id for _ in range(3)}  # type: ignore[union-attr]
    assert picked == {"a", "b", "c"}


def test_pick_skips_excluded_replicas_and_other_models() -> None:
    table = ReplicaTable()
    table.set_ready(replica("a"))
    table.set_ready(replica("b"))
    table.set_ready(replica("x", model="other"))
    assert table.pick("m", exclude={"a"}) == replica("b")
    assert table.pick("m", exclude={"a", "b"}) is None
    assert table.pick("nothing") is None
    assert table.models() == {"m", "other"}


def test_a_lease_counts_until_released_once() -> None:
    table = ReplicaTable()
    table.set_ready(replica("a"))
    with table.acquire(replica("a")) as lease:
        assert table.in_flight("a") == 1
        lease.release()
        assert table.in_flight("a") == 0
    assert table.in_flight("a") == 0


def test_a_replica_removed_while_busy_leaves_routing_and_its_lease_still_ends() -> None:
    table = ReplicaTable()
    table.set_ready(replica("a"))
    lease = table.acquire(replica("a"))
    assert table.remove("a") == replica("a")
    assert table.ready("m") == []
    assert table.models() == set()
    lease.release()
    assert table.acquire(replica("a")) is not None  # a lease on a removed replica does not fail


def test_set_ready_again_updates_capacity_and_keeps_the_load() -> None:
    table = ReplicaTable()
    table.set_ready(replica("a", capacity=1))
    lease = table.acquire(replica("a"))
    table.set_ready(replica("a", capacity=4))
    assert table.in_flight("a") == 1
    assert table.ready("m") == [replica("a", capacity=4)]
    lease.release()


def test_replace_keeps_only_the_given_replicas() -> None:
    table = ReplicaTable()
    table.set_ready(replica("a"))
    table.set_ready(replica("b"))
    lease = table.acquire(replica("b"))
    table.replace([replica("b"), replica("c")])
    assert sorted(e.replica_id for e in table.ready("m")) == ["b", "c"]
    assert table.in_flight("b") == 1
    lease.release()


async def test_wait_ready_returns_as_soon_as_a_replica_is_set_ready() -> None:
    table = ReplicaTable()
    waiting = asyncio.create_task(table.wait_ready("m", timeout_s=30))
    await asyncio.sleep(0)  # let the waiter register
    assert not waiting.done()
    table.set_ready(replica("other", model="other"))
    await asyncio.sleep(0)
    assert not waiting.done()
    table.set_ready(replica("a"))
    assert await asyncio.wait_for(waiting, 5) is True


async def test_wait_ready_is_false_when_nothing_became_ready_in_time() -> None:
    table = ReplicaTable()
    assert await table.wait_ready("m", timeout_s=0.01) is False
    table.set_ready(replica("a"))
    assert await table.wait_ready("m", timeout_s=0) is True


def test_an_engine_reading_adds_only_requests_this_gateway_did_not_send() -> None:
    table = ReplicaTable()
    a, b = replica("a", capacity=4), replica("b", capacity=4)
    table.set_ready(a)
    table.set_ready(b)
    ours = [table.acquire(a) for _ in range(3)]
    table.set_engine_load("a", 3)  # the engine saw exactly our three
    table.set_engine_load("b", 2)  # two requests someone else sent
    for lease in ours:
        lease.release()
    # A second-old reading of our own requests no longer counts once they ended...
    assert table.pick("m") == a
    # ...while the other sender's two on b still do.
    lease = table.acquire(a)
    assert table.pick("m") == a  # 1/4 against 2/4
    lease.release()


def test_a_draining_replica_takes_no_new_request_and_its_requests_are_still_counted() -> None:
    table = ReplicaTable()
    table.set_ready(replica("a"))
    table.set_ready(replica("b"))
    lease = table.acquire(replica("a"))
    table.drain("a")
    assert [table.pick("m") for _ in range(3)] == [replica("b")] * 3
    assert table.in_flight("a") == 1
    lease.release()
    assert table.in_flight("a") == 0
    table.remove("a")
    assert table.in_flight("a") == 0


async def test_model_load_counts_running_queued_and_waiting_requests() -> None:
    clock = FakeClock()
    table = ReplicaTable(clock=clock)
    a = replica("a", capacity=2)
    table.set_ready(a)
    leases = [table.acquire(a) for _ in range(3)]
    table.saw_ttft("m", 0.25)
    load = table.model_load("m")
    assert (load.ready, load.slots, load.running, load.waiting) == (1, 2, 2, 1)
    assert load.ttft_ms == 250
    for lease in leases:
        lease.release()
    await clock.advance(3600)
    assert table.model_load("m").ttft_ms is None


async def test_requests_waiting_for_a_replica_count_as_waiting() -> None:
    table = ReplicaTable()
    waiting = asyncio.create_task(table.wait_ready("m", timeout_s=30))
    await asyncio.sleep(0)
    assert table.model_load("m").waiting == 1
    table.set_ready(replica("a"))
    assert await asyncio.wait_for(waiting, 5) is True
    assert table.model_load("m").waiting == 0
