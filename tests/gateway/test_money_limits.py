"""Money budgets in the gateway: requests priced as they pass and when they end, refused 429
budget_exceeded from memory, the counts handed to the control plane and read back beside the tokens'."""

from __future__ import annotations

import json

import httpx
import pytest

from llmgw.core.limits import Limits
from llmgw.core.pricing import Price, Prices, nanos
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, hash_secret
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.limiting import Limiter
from llmgw.testing.clock import FakeClock

from .conftest import AUTH, MESSAGES, MODEL, SECRET, MemoryEngine

PROJECT = "project:acme/ml/chat"
CHAT = {"model": MODEL, "messages": MESSAGES}
PRICE = Price(input=1_000.0, output=2_000.0)
"""Dear on purpose: the in-memory engine's 7 prompt and 3 completion tokens cost 0.013."""
KEY = KeyEntry("key-1", "tests", hash_secret(SECRET), None, Place(Owner.parse(PROJECT)))


def limiter_with(limits: dict[str, Limits], clock: FakeClock) -> Limiter:
    limiter = Limiter(clock=clock.time)
    limiter.prices = Prices({MODEL: PRICE}, "EUR")
    limiter.replace_keys([KEY])
    limiter.replace_limits(limits)
    return limiter


def test_a_stream_counts_its_tokens_at_the_output_price_and_the_end_puts_the_exact_cost() -> None:
    limiter = limiter_with({PROJECT: Limits(usd_per_day=1.0)}, FakeClock())
    ticket = limiter.admit(KEY, MODEL)
    assert ticket is not None
    ticket.spend(5)
    meter = limiter.meter(PROJECT)
    assert meter is not None and meter.cost_day_used == nanos(5 * 2_000 / 1_000_000)
    ticket.end(15, PRICE.cost(10, 5))
    assert meter.cost_day_used == nanos(0.02) and meter.day_used == 15
    assert meter.concurrent == 0


def test_a_stream_running_a_money_budget_out_is_told_the_refusal() -> None:
    limiter = limiter_with({PROJECT: Limits(usd_per_day=0.01)}, FakeClock())
    ticket = limiter.admit(KEY, MODEL)
    assert ticket is not None
    assert ticket.spend(4) is None  # 0.008
    refusal = ticket.spend(1)  # 0.010: spent
    assert refusal is not None and refusal.code == "budget_exceeded"
    assert "EUR" in refusal.message


def test_a_model_without_a_price_spends_no_money() -> None:
    limiter = limiter_with({PROJECT: Limits(usd_per_day=0.01)}, FakeClock())
    limiter.prices = Prices()
    ticket = limiter.admit(KEY, MODEL)
    assert ticket is not None
    ticket.spend(100)
    ticket.end(1_000, 0.0)
    assert limiter.admit(KEY, MODEL) is not None


def test_the_money_counted_goes_out_beside_the_tokens_and_comes_back_with_the_stores_counts() -> None:
    limiter = limiter_with({PROJECT: Limits(usd_per_month=5.0)}, FakeClock())
    ticket = limiter.admit(KEY, MODEL)
    assert ticket is not None
    ticket.end(10, 0.013)
    assert limiter.unsaved() == {PROJECT: 10, f"cost:{PROJECT}": nanos(0.013)}
    assert limiter.unsaved() == {}
    limiter.counted({PROJECT: (100, 200), f"cost:{PROJECT}": (nanos(4.0), nanos(5.0))})
    meter = limiter.meter(PROJECT)
    assert meter is not None and (meter.cost_day_used, meter.cost_month_used) == (nanos(4.0), nanos(5.0))
    with pytest.raises(ApiError, match="usd_per_month"):
        limiter.admit(KEY, MODEL)
    assert limiter.totals()[f"cost:{PROJECT}"] == (nanos(4.0), nanos(5.0))


def test_what_a_worker_counted_adds_to_the_money_as_to_the_tokens() -> None:
    limiter = limiter_with({PROJECT: Limits(usd_per_day=1.0)}, FakeClock())
    limiter.add_counted({PROJECT: 7, f"cost:{PROJECT}": nanos(0.5), "cost:team:x/y": 3})
    meter = limiter.meter(PROJECT)
    assert meter is not None and (meter.day_used, meter.cost_day_used) == (7, nanos(0.5))
    assert limiter.unsaved() == {PROJECT: 7, f"cost:{PROJECT}": nanos(0.5)}


async def test_the_budget_starts_again_when_the_fake_clock_passes_midnight() -> None:
    clock = FakeClock(wall=1_764_590_400.0)  # 2025-12-01T12:00:00Z
    limiter = limiter_with({PROJECT: Limits(usd_per_day=0.01)}, clock)
    ticket = limiter.admit(KEY, MODEL)
    assert ticket is not None
    ticket.end(10, 0.02)
    with pytest.raises(ApiError, match="usd_per_day"):
        limiter.admit(KEY, MODEL)
    await clock.advance(12 * 3600)
    assert limiter.admit(KEY, MODEL) is not None


async def test_a_project_over_its_money_budget_is_refused_429_budget_exceeded(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    gateway.feed.prices_replaced(Prices({MODEL: PRICE}))
    gateway.feed.keys_replaced([KEY])
    gateway.feed.limits_replaced({PROJECT: Limits(usd_per_day=0.02)})
    for _ in range(2):  # 0.013 each: the second is admitted with 0.007 left
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)).status_code == 200
    refused = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded"
    assert "spent 0.026000 USD this day, its budget is 0.02 USD" in error["message"]
    assert "resets at" in error["message"] and int(refused.headers["Retry-After"]) >= 1
    assert len(engine.requests) == 2


async def test_a_stream_that_spends_the_money_budget_ends_with_an_error_event(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    engine.chunks = 50
    gateway.replicas.set_ready(engine.endpoint)
    gateway.feed.prices_replaced(Prices({MODEL: PRICE}))
    gateway.feed.keys_replaced([KEY])
    gateway.feed.limits_replaced({PROJECT: Limits(usd_per_day=0.01)})
    answer = await http.post("/v1/chat/completions", json=CHAT | {"stream": True}, headers=AUTH)
    events = [e[len("data: ") :] for e in answer.text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "budget_exceeded"
    assert len(events) - 2 < 50
