"""A request its model cannot answer falls to the model's fallbacks, in memory: each trigger (no
ready replica, 429, 5xx, a slow first token), never once the first byte reached the client, only
to models the key sees and may use, within the retry budget, past an open circuit breaker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from llmgw.core.breakers import BreakerState
from llmgw.core.fallbacks import FallbackSettings
from llmgw.core.limits import Limits, key_subject
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret

from .conftest import AUTH, MESSAGES, MODEL, SECRET, WAIT, MemoryEngine, MemoryUpstream, RecordingOutbound

BIG = "big-chat"
"""A model falling to :data:`MID`, then to :data:`MODEL`."""
MID = "mid-chat"
TTFT_S = 0.2


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> GatewaySettings:
    changes = getattr(request, "param", {})
    return GatewaySettings(request_wait_s=0.3, retry_after_s=5, fallbacks=FallbackSettings(**changes))


@pytest.fixture
async def big(gateway: Gateway, upstream: MemoryUpstream) -> AsyncIterator[MemoryEngine]:
    """The engine of :data:`BIG` (not ready until a test says so); the catalog gets BIG and MID."""
    gateway.catalog.put(ModelEntry(BIG, fallbacks=(MID, MODEL), fallback_ttft_s=TTFT_S))
    gateway.catalog.put(ModelEntry(MID))
    engine = upstream.engine(MemoryEngine(replica_id="b1", model=BIG))
    yield engine
    await engine.stop()


@pytest.fixture
async def mid(upstream: MemoryUpstream) -> AsyncIterator[MemoryEngine]:
    engine = upstream.engine(MemoryEngine(replica_id="m1", model=MID))
    yield engine
    await engine.stop()


def fallbacks(reason: str, fell_from: str = BIG, to: str = MID) -> float:
    labels = {"model": BIG, "from": fell_from, "to": to, "reason": reason}
    return REGISTRY.get_sample_value("llmgw_gateway_fallbacks_total", labels) or 0.0


async def chat(http: httpx.AsyncClient, model: str = BIG, stream: bool = False) -> httpx.Response:
    body = json.dumps({"model": model, "messages": MESSAGES, "stream": stream})
    return await asyncio.wait_for(http.post("/v1/chat/completions", content=body, headers=AUTH), WAIT)


def sent_model(engine: MemoryEngine) -> str:
    return str(json.loads(engine.requests[-1].body)["model"])


async def test_a_model_with_no_ready_replica_falls_to_the_next_at_once_and_asks_for_one(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(mid.endpoint)
    before = fallbacks("no_replica")
    answer = await chat(http)
    assert answer.status_code == 200
    assert answer.headers["x-llmgw-served-by"] == MID
    assert answer.json()["choices"][0]["message"]["content"].startswith("m1")
    assert sent_model(mid) == MID  # the engine is asked for the model it serves
    assert hooks.wanted == [BIG]
    assert fallbacks("no_replica") == before + 1
    assert [(r.model, r.status) for r in hooks.records] == [
        (MID, 200)
    ]  # usage counts the model that answered


@pytest.mark.parametrize(
    ("status", "reason"), [(429, "status_429"), (500, "status_5xx"), (503, "status_5xx")]
)
async def test_a_model_answering_429_or_5xx_falls_to_the_next(
    gateway: Gateway,
    big: MemoryEngine,
    mid: MemoryEngine,
    http: httpx.AsyncClient,
    hooks: RecordingOutbound,
    status: int,
    reason: str,
) -> None:
    big.error = (status, b'{"error": {"message": "busy", "code": 500}}')
    gateway.replicas.set_ready(big.endpoint)
    gateway.replicas.set_ready(mid.endpoint)
    before = fallbacks(reason)
    answer = await chat(http, stream=True)
    assert answer.status_code == 200
    assert answer.headers["x-llmgw-served-by"] == MID
    assert "m1-0" in answer.text and "busy" not in answer.text
    assert len(big.requests) == 1
    assert fallbacks(reason) == before + 1
    assert [(r.model, r.status, r.completion_tokens > 0) for r in hooks.records] == [
        (BIG, status, False),
        (MID, 200, True),
    ]


async def test_a_model_slower_than_its_fallback_ttft_falls_to_the_next_and_its_request_is_closed(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, http: httpx.AsyncClient
) -> None:
    big.hold = asyncio.Event()  # never answers
    gateway.replicas.set_ready(big.endpoint)
    gateway.replicas.set_ready(mid.endpoint)
    before = fallbacks("slow_first_token")
    answer = await chat(http, stream=True)
    assert answer.status_code == 200
    assert answer.headers["x-llmgw-served-by"] == MID
    assert "m1-0" in answer.text
    await asyncio.wait_for(big.dropped.wait(), WAIT)
    assert fallbacks("slow_first_token") == before + 1
    assert gateway.replicas.in_flight("b1") == 0


async def test_a_stream_failing_after_its_first_byte_is_not_tried_again(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, http: httpx.AsyncClient
) -> None:
    big.cut_after = 1
    gateway.replicas.set_ready(big.endpoint)
    gateway.replicas.set_ready(mid.endpoint)
    answer = await chat(http, stream=True)
    assert answer.headers["x-llmgw-served-by"] == BIG
    assert "b1-0" in answer.text
    assert "failed mid-answer" in answer.text
    assert mid.requests == []


async def test_a_first_token_in_time_keeps_the_stream_however_slow_the_rest(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, http: httpx.AsyncClient
) -> None:
    big.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(big.endpoint)
    gateway.replicas.set_ready(mid.endpoint)
    asked = asyncio.create_task(chat(http, stream=True))
    await asyncio.wait_for(big.arrived.wait(), WAIT)
    await asyncio.sleep(TTFT_S * 2)  # past the first-token limit, after the first token went
    big.hold_after_first.set()
    answer = await asked
    assert answer.headers["x-llmgw-served-by"] == BIG
    assert "b1-2" in answer.text
    assert mid.requests == []


async def test_a_fallback_the_key_does_not_see_is_not_fallen_to(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.catalog.put(ModelEntry(MID, owned=Owner.parse("org:other")))
    gateway.catalog.put(ModelEntry(BIG, fallbacks=(MID,)))
    gateway.replicas.set_ready(mid.endpoint)
    answer = await chat(http)
    assert answer.status_code == 503
    assert answer.headers["x-llmgw-served-by"] == BIG
    assert mid.requests == []


async def test_a_fallback_the_keys_limits_do_not_allow_is_passed_over(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    place = Place(Owner.parse("user:alice"))
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", place)])
    gateway.feed.limits_replaced({key_subject("key-1"): Limits(models=frozenset({BIG, MODEL}))})
    gateway.replicas.set_ready(mid.endpoint)
    gateway.replicas.set_ready(engine.endpoint)
    answer = await chat(http)
    assert answer.status_code == 200
    assert answer.headers["x-llmgw-served-by"] == MODEL
    assert mid.requests == []


@pytest.mark.parametrize("settings", [{"max_targets": 1}], indirect=True)
async def test_past_its_budget_a_request_answers_the_last_failure_as_given(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    big.error = (500, b'{"error": {"message": "big broke"}}')
    mid.error = (503, b'{"error": {"message": "mid is loading"}}')
    for ready in (big, mid, engine):
        gateway.replicas.set_ready(ready.endpoint)
    answer = await chat(http)
    assert answer.status_code == 503
    assert answer.headers["x-llmgw-served-by"] == MID
    assert "mid is loading" in answer.json()["error"]["message"]
    assert engine.requests == []


@pytest.mark.parametrize("settings", [{"breaker_failures": 2, "breaker_open_s": 60}], indirect=True)
async def test_a_target_failing_often_is_skipped_while_its_breaker_is_open(
    gateway: Gateway, big: MemoryEngine, mid: MemoryEngine, http: httpx.AsyncClient
) -> None:
    big.error = (500, b'{"error": {"message": "big broke"}}')
    gateway.replicas.set_ready(big.endpoint)
    gateway.replicas.set_ready(mid.endpoint)
    before = fallbacks("breaker_open")
    for _ in range(3):
        assert (await chat(http)).headers["x-llmgw-served-by"] == MID
    assert len(big.requests) == 2  # the third request skipped it
    assert fallbacks("breaker_open") == before + 1
    assert gateway.falling_back.breakers.states()[BIG] is BreakerState.OPEN
    assert REGISTRY.get_sample_value("llmgw_gateway_breaker_state", {"model": BIG}) == 1


async def test_a_model_without_fallbacks_names_itself_on_its_answers(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    assert (await chat(http, MODEL)).headers["x-llmgw-served-by"] == MODEL
    gateway.replicas.set_ready(engine.endpoint)
    answer = await chat(http, MODEL)
    assert answer.status_code == 200
    assert answer.headers["x-llmgw-served-by"] == MODEL
