"""What requests cost: the engine's tokens at the model's price, on the usage record and the metric;
cached prompt tokens read where engines report them."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY

from llmgw.core.pricing import Price, Prices
from llmgw.gateway import Gateway
from llmgw.gateway.usage import EventFramer, cached_count, whole_counts
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine

from .conftest import MESSAGES, MODEL, RecordingOutbound

PRICE = Price(input=2.0, output=10.0)


def cost_metric(model: str, project: str = "") -> float:
    labels = {"model": model, "project": project}
    return REGISTRY.get_sample_value("llmgw_gateway_cost_total", labels) or 0.0


async def test_a_whole_answer_costs_its_engines_tokens_at_the_models_price(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.prices_replaced(Prices({MODEL: PRICE}))
    gateway.replicas.set_ready(engine.endpoint)
    before = cost_metric(MODEL, "")
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await eventually(lambda: hooks.records, message="the usage was told")
    (record,) = hooks.records
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)
    assert record.cost == pytest.approx((7 * 2.0 + 3 * 10.0) / 1_000_000)
    await eventually(
        lambda: cost_metric(MODEL, record.place) - before == pytest.approx(record.cost),
        message="the cost was counted by model and project",
    )


async def test_a_stream_costs_the_tokens_of_its_engines_usage(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks = 5
    gateway.feed.prices_replaced(Prices({MODEL: PRICE}))
    gateway.replicas.set_ready(engine.endpoint)
    async for _ in await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True):
        pass
    await eventually(lambda: hooks.records, message="the usage was told")
    (record,) = hooks.records
    assert record.cost == pytest.approx((7 * 2.0 + 5 * 10.0) / 1_000_000)


async def test_a_model_without_a_price_costs_nothing(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.prices_replaced(Prices({"another-model": PRICE}))
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].cost == 0.0


async def test_a_new_price_applies_to_requests_admitted_from_then_on(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    gateway.feed.prices_replaced(Prices({MODEL: PRICE}))
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    gateway.feed.prices_replaced(Prices({MODEL: Price(input=4.0, output=20.0)}))
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await eventually(lambda: len(hooks.records) == 2, message="both usages were told")
    assert [r.cost for r in hooks.records] == pytest.approx([44 / 1_000_000, 88 / 1_000_000])


def test_cached_tokens_come_from_openais_usage_details() -> None:
    assert cached_count({"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 12}}) == 12
    assert cached_count({"input_tokens": 30, "input_tokens_details": {"cached_tokens": 4}}) == 4


def test_cached_tokens_come_from_llamacpps_timings_when_the_usage_has_none() -> None:
    assert cached_count({"prompt_tokens": 30}, {"cache_n": 25, "prompt_n": 5}) == 25
    assert cached_count({"prompt_tokens": 30}, None) == 0
    assert cached_count(None, {"cache_n": True}) == 0


def test_a_whole_llamacpp_answer_gives_its_prompt_completion_and_cached_tokens() -> None:
    body = (
        b'{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":3,"prompt_tokens":30,'
        b'"total_tokens":33},"timings":{"cache_n":26,"prompt_n":4,"predicted_n":3}}'
    )
    assert whole_counts(body) == (30, 3, 26)


def test_a_streams_last_event_gives_llamacpps_cached_tokens() -> None:
    framer = EventFramer()
    framer.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
    framer.feed(
        b'data: {"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":9},'
        b'"timings":{"cache_n":8,"prompt_n":1}}\n\n'
    )
    assert framer.counts() == (9, 1, 8)
