"""Limits on the request path: refusals with OpenAI's headers, budgets cut streams, slots come back."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI

from llmgw.core.limits import Limits
from llmgw.core.limitshares import FLOOR, divide
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, hash_secret
from llmgw.testing.eventually import eventually

from .conftest import AUTH, MESSAGES, MODEL, SECRET, WAIT, MemoryEngine

PROJECT = "project:acme/ml/chat"
CHAT = {"model": MODEL, "messages": MESSAGES}


def limited(gateway: Gateway, limits: dict[str, Limits]) -> None:
    """The test key sits in acme/ml/chat; ``limits`` by subject."""
    place = Place(Owner.parse(PROJECT))
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), None, place)])
    gateway.feed.limits_replaced(limits)


async def test_a_request_over_the_projects_rate_is_refused_with_openais_headers(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    limited(gateway, {PROJECT: Limits(requests_per_minute=2)})
    for _ in range(2):
        ok = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert ok.status_code == 200
    refused = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert refused.status_code == 429
    body = refused.json()
    headers = refused.headers
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert "requests_per_minute" in body["error"]["message"] and PROJECT in body["error"]["message"]
    assert int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert len(engine.requests) == 2


async def test_a_model_not_allowed_to_the_key_is_refused_403(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    limited(gateway, {"key:key-1": Limits(models=frozenset({"other"}))})
    refused = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert engine.requests == []


async def test_an_expired_key_is_refused(gateway: Gateway, http: httpx.AsyncClient) -> None:
    limited(gateway, {"key:key-1": Limits(expires_s=1.0)})
    refused = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "expired_api_key"


async def test_tokens_of_an_answer_count_against_the_teams_daily_budget(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    limited(gateway, {"team:acme/ml": Limits(tokens_per_day=15)})
    for _ in range(2):  # 10 tokens each: the second is admitted with 5 left
        ok = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert ok.status_code == 200
    meter = gateway.limiter.meter("team:acme/ml")
    assert meter is not None and meter.day_used == 20
    refused = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert refused.status_code == 429
    assert "tokens_per_day" in refused.json()["error"]["message"]
    assert gateway.feed.limits_unsaved() == {"team:acme/ml": 20}
    assert gateway.feed.limits_unsaved() == {}


async def test_a_stream_that_spends_the_budget_ends_with_an_error_event_and_done(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    engine.chunks = 50
    gateway.replicas.set_ready(engine.endpoint)
    limited(gateway, {PROJECT: Limits(tokens_per_month=5)})
    answer = await http.post("/v1/chat/completions", json=CHAT | {"stream": True}, headers=AUTH)
    assert answer.status_code == 200
    text = answer.text
    events = [e[len("data: ") :] for e in text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "rate_limit_exceeded" and "tokens_per_month" in error["message"]
    assert 5 <= len(events) - 2 < 50  # cut as the budget ran out, not at the end


async def test_a_concurrent_slot_comes_back_when_the_client_disconnects(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    limited(gateway, {PROJECT: Limits(concurrent=1)})
    meter = gateway.limiter.meter(PROJECT)
    assert meter is not None
    first = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=MESSAGES))
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    assert meter.concurrent == 1
    try:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    except Exception as error:
        assert getattr(error, "status_code", None) == 429
    else:
        raise AssertionError("a second concurrent request was admitted over the limit")
    first.cancel()
    await eventually(lambda: meter.concurrent == 0, timeout_s=WAIT)
    engine.hold.set()
    done = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert done.choices[0].message.content == "r1"
    assert meter.concurrent == 0


async def test_a_key_with_nothing_limited_holds_no_ticket(gateway: Gateway) -> None:
    limited(gateway, {"project:other/x/y": Limits(requests_per_minute=1)})
    key = gateway.keys.lookup(SECRET)
    assert key is not None
    assert gateway.limiter.admit(key, MODEL) is None


def test_a_planes_share_scales_each_meter_and_a_workers_share_scales_it_again(gateway: Gateway) -> None:
    gateway.limiter.share = 0.5  # one of two workers
    gateway.limiter.plane = "cp2"
    limited(
        gateway, {PROJECT: Limits(requests_per_minute=120, concurrent=8), "key:key-1": Limits(concurrent=4)}
    )
    meter = gateway.limiter.meter(PROJECT)
    assert meter is not None and meter.requests is not None
    assert (meter.requests.capacity, meter.concurrent_cap) == (60, 4)
    gateway.feed.limits_shared(divide(["cp1", "cp2"], {"cp1": {PROJECT: 3.0}, "cp2": {PROJECT: 1.0}}))
    share = FLOOR / 2 + (1 - FLOOR) / 4  # cp2 used a quarter
    assert meter.requests.capacity == pytest.approx(120 * 0.5 * share)
    assert meter.concurrent_cap == pytest.approx(8 * 0.5 * share)
    key_meter = gateway.limiter.meter("key:key-1")
    assert key_meter is not None and key_meter.concurrent_cap == 4 * 0.5 * 0.5  # unused: an even split
    limited(gateway, {PROJECT: Limits(requests_per_minute=240)})  # limits change: the share stays
    assert meter.requests.capacity == pytest.approx(240 * 0.5 * share)
