"""Waiting in the gateway for a busy model's slot (gateway.flow.mode: fair): fair, by priority, bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, hash_secret
from llmgw.testing.asgi_client import asgi_client
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine

from .conftest import MODEL, SECRET, WAIT

BOB = "sk-llmgw-test-bob-0123456789"
FAIR = {"flow": {"mode": "fair", "queue_timeout_s": WAIT, "reserve_share": 0.25}}
pytestmark = pytest.mark.parametrize("settings", [FAIR], indirect=True)


@pytest.fixture
async def raw(gateway: Gateway, engine: MemoryEngine) -> AsyncIterator[httpx.AsyncClient]:
    """A one-slot replica held busy until the test releases it; alice's and bob's keys."""
    gateway.keys.add(KeyEntry("key-2", "bob", hash_secret(BOB), "user:bob", Place(Owner.parse("user:bob"))))
    engine.hold = asyncio.Event()
    gateway.feed.replica_ready(dataclasses.replace(engine.endpoint, capacity=1))
    async with asgi_client(gateway.asgi_app(), "http://gateway.test", timeout=WAIT * 2) as client:
        yield client


def _ask(client: httpx.AsyncClient, who: str, secret: str = SECRET, **headers: str) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": who}]}
    headers["Authorization"] = f"Bearer {secret}"
    return asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))


def _served(engine: MemoryEngine) -> list[str]:
    return [json.loads(r.body)["messages"][0]["content"] for r in engine.requests]


def _depth(gateway: Gateway) -> int:
    assert gateway.finder.flow is not None
    return gateway.finder.flow.depth().get(MODEL, 0)


async def test_a_late_project_is_served_before_the_rest_of_a_flood(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    flood = [_ask(raw, f"alice-{n}") for n in range(4)]
    await eventually(lambda: _depth(gateway) == 3)  # one on the replica, three waiting
    chat = _ask(raw, "bob", BOB)
    await eventually(lambda: _depth(gateway) == 4)
    assert gateway.replicas.model_load(MODEL).waiting == 4  # autoscaling sees the queue as demand
    engine.hold.set()  # type: ignore[union-attr]
    answers = await asyncio.gather(*flood, chat)
    assert [a.status_code for a in answers] == [200] * 5 and gateway.replicas.model_load(MODEL).waiting == 0
    served = _served(engine)
    assert served.index("bob") == 2 and len(served) == 5  # FIFO would have sent it last


async def test_a_lower_priority_waits_behind_a_normal_one(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    first = _ask(raw, "alice-first")
    await eventually(lambda: engine.requests)
    batch = _ask(raw, "alice-batch", **{"x-llmgw-priority": "1"})
    await eventually(lambda: _depth(gateway) == 1)
    chat = _ask(raw, "bob", BOB)
    await eventually(lambda: _depth(gateway) == 2)
    engine.hold.set()  # type: ignore[union-attr]
    await asyncio.gather(first, batch, chat)
    assert _served(engine) == ["alice-first", "bob", "alice-batch"]


async def test_a_request_past_its_deadline_is_answered_429_with_retry_after(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    first = _ask(raw, "alice-first")
    await eventually(lambda: engine.requests)
    late = await _ask(raw, "alice-late", **{"x-llmgw-deadline-ms": "50"})
    assert late.status_code == 429 and late.headers["retry-after"]
    error = late.json()["error"]
    assert error["code"] == "queue_timeout" and "within 0.05 s" in error["message"]
    assert _depth(gateway) == 0
    engine.hold.set()  # type: ignore[union-attr]
    assert (await first).status_code == 200


async def test_a_priority_that_is_no_number_is_refused_400(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    first = _ask(raw, "alice-first")
    await eventually(lambda: engine.requests)
    bad = await _ask(raw, "alice-bad", **{"x-llmgw-priority": "urgent"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-llmgw-priority"
    engine.hold.set()  # type: ignore[union-attr]
    assert (await first).status_code == 200


async def test_a_client_leaving_while_it_waits_gives_up_its_place(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    first = _ask(raw, "alice-first")
    await eventually(lambda: engine.requests)
    leaving = _ask(raw, "alice-leaving")
    await eventually(lambda: _depth(gateway) == 1)
    leaving.cancel()
    await eventually(lambda: _depth(gateway) == 0)
    engine.hold.set()  # type: ignore[union-attr]
    assert (await first).status_code == 200
    after = await _ask(raw, "alice-after")
    assert after.status_code == 200 and _served(engine) == ["alice-first", "alice-after"]


async def test_sheddable_requests_leave_the_reserve_to_the_others(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    gateway.feed.replica_ready(dataclasses.replace(engine.endpoint, capacity=4))  # a quarter: 1 slot
    batch = [_ask(raw, f"alice-batch-{n}", **{"x-llmgw-priority": "0"}) for n in range(4)]
    await eventually(lambda: len(engine.requests) == 3 and _depth(gateway) == 1)
    chat = _ask(raw, "bob", BOB)
    await eventually(lambda: len(engine.requests) == 4)  # straight to the slot kept free
    assert _served(engine)[-1] == "bob" and _depth(gateway) == 1
    engine.hold.set()  # type: ignore[union-attr]
    answers = await asyncio.gather(*batch, chat)
    assert [a.status_code for a in answers] == [200] * 5 and len(engine.requests) == 5


async def test_a_projects_priority_puts_its_requests_ahead_and_its_keys_may_only_lower_it(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    gateway.feed.keys_replaced([gateway.keys.get("key-1"), gateway.keys.get("key-2")])  # type: ignore[list-item]
    gateway.feed.limits_replaced({"user:bob": Limits(priority=8), "key:key-1": Limits(priority=9)})
    first = _ask(raw, "alice-first")
    await eventually(lambda: engine.requests)
    alice = _ask(raw, "alice")  # her key asks 9, but her user sets none: 5 at most
    await eventually(lambda: _depth(gateway) == 1)
    bob_lowered = _ask(raw, "bob-lowered", BOB, **{"x-llmgw-priority": "2"})
    await eventually(lambda: _depth(gateway) == 2)
    bob = _ask(raw, "bob", BOB, **{"x-llmgw-priority": "9"})  # capped at his user's 8
    await eventually(lambda: _depth(gateway) == 3)
    engine.hold.set()  # type: ignore[union-attr]
    await asyncio.gather(first, alice, bob_lowered, bob)
    assert _served(engine) == ["alice-first", "bob", "alice", "bob-lowered"]
    assert gateway.limiter.priority(gateway.keys.get("key-1")) == 5
    assert gateway.limiter.priority(gateway.keys.get("key-2")) == 8


def _depth_of(flow: str) -> float | None:
    return REGISTRY.get_sample_value("llmgw_gateway_queue_depth", {"model": MODEL, "flow": flow})


async def test_who_waits_is_told_per_flow_and_the_latest_wait_once_sent_on(
    gateway: Gateway, engine: MemoryEngine, raw: httpx.AsyncClient
) -> None:
    waits = {"model": MODEL, "flow": "user:bob"}
    before = REGISTRY.get_sample_value("llmgw_gateway_queue_wait_seconds_count", waits) or 0
    first = _ask(raw, "alice-first")
    await eventually(lambda: engine.requests)
    waiting = [_ask(raw, "alice-1"), _ask(raw, "alice-2"), _ask(raw, "bob", BOB)]
    await eventually(lambda: _depth(gateway) == 3)
    state = gateway.finder.queues()[MODEL]
    assert (state.waiting, state.by_flow, state.last_wait_s) == (3, {"user:alice": 2, "user:bob": 1}, None)
    assert (_depth_of("user:alice"), _depth_of("user:bob")) == (2, 1)
    engine.hold.set()  # type: ignore[union-attr]
    await asyncio.gather(first, *waiting)
    after = gateway.finder.queues()[MODEL]
    assert after.waiting == 0 and after.by_flow == {} and after.last_wait_s is not None
    assert _depth_of("user:alice") is None and _depth_of("user:bob") is None  # series of flows gone
    assert REGISTRY.get_sample_value("llmgw_gateway_queue_wait_seconds_count", waits) == before + 1
