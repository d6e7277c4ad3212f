"""The gateway's request metrics, scraped from the process registry after requests through the gateway."""

from __future__ import annotations

import asyncio
import logging

import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY

from llmgw.gateway import Gateway, GatewaySettings, KeyEntry
from llmgw.gateway.metrics import project_of
from llmgw.testing.eventually import eventually

from .conftest import MESSAGES, MODEL, FakeEngine

PROJECT = "user:alice"
"""The test key's owner: its project until keys carry one."""


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def answered() -> float:
    """Requests of the test key answered 200."""
    return sample("llmgw_gateway_requests_total", model=MODEL, project=PROJECT, code="200")


def test_a_keys_project_is_its_owner_until_keys_carry_one() -> None:
    assert project_of(KeyEntry("k", "n", "h", "team-a")) == "team-a"
    assert project_of(KeyEntry("k", "n", "h", None)) == ""
    assert project_of(None) == ""


async def test_an_answered_request_is_counted_timed_and_its_tokens_added_by_model_and_project(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    requests = answered()
    timed = sample("llmgw_gateway_request_duration_seconds_count", model=MODEL, project=PROJECT)
    prompt = sample("llmgw_gateway_prompt_tokens_total", model=MODEL, project=PROJECT)
    completion = sample("llmgw_gateway_completion_tokens_total", model=MODEL, project=PROJECT)

    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.usage is not None

    await eventually(lambda: answered() == requests + 1)
    assert sample("llmgw_gateway_request_duration_seconds_count", model=MODEL, project=PROJECT) == timed + 1
    assert (
        sample("llmgw_gateway_prompt_tokens_total", model=MODEL, project=PROJECT)
        == prompt + answer.usage.prompt_tokens
    )
    assert (
        sample("llmgw_gateway_completion_tokens_total", model=MODEL, project=PROJECT)
        == completion + answer.usage.completion_tokens
    )


async def test_a_stream_observes_its_first_token_once_and_the_gaps_after_it(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    engine.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    first = sample("llmgw_gateway_time_to_first_token_seconds_count", model=MODEL)
    gaps = sample("llmgw_gateway_time_between_tokens_seconds_count", model=MODEL)
    completion = sample("llmgw_gateway_completion_tokens_total", model=MODEL, project=PROJECT)

    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    pieces = [await anext(aiter(stream))]
    engine.hold_after_first.set()  # the rest comes apart from the first: at least one gap
    pieces += [chunk async for chunk in stream]

    await eventually(
        lambda: (
            sample("llmgw_gateway_completion_tokens_total", model=MODEL, project=PROJECT)
            == completion + engine.chunks
        ),
        message="the stream's tokens (usage the gateway asked for) are counted",
    )
    assert sample("llmgw_gateway_time_to_first_token_seconds_count", model=MODEL) == first + 1
    observed_gaps = sample("llmgw_gateway_time_between_tokens_seconds_count", model=MODEL) - gaps
    assert 1 <= observed_gaps <= len(pieces) + 1  # one per relayed piece after the first (+ [DONE])


async def test_a_whole_answer_observes_no_token_timing(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    first = sample("llmgw_gateway_time_to_first_token_seconds_count", model=MODEL)
    requests = answered()

    await client.chat.completions.create(model=MODEL, messages=MESSAGES)

    await eventually(lambda: answered() == requests + 1)
    assert sample("llmgw_gateway_time_to_first_token_seconds_count", model=MODEL) == first


@pytest.mark.parametrize("access_log", [True, False])
async def test_the_access_log_has_one_line_per_request_only_when_asked(
    access_log: bool,
    gateway: Gateway,
    engine: FakeEngine,
    client: AsyncOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway.settings = GatewaySettings(**{**gateway.settings.model_dump(), "access_log": access_log})
    gateway.replicas.set_ready(engine.endpoint)
    requests = answered()
    caplog.set_level(logging.INFO, logger="llmgw.access")

    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await eventually(lambda: answered() == requests + 1)

    lines = [r for r in caplog.records if r.name == "llmgw.access"]
    if not access_log:
        assert lines == []
        return
    assert len(lines) == 1
    fields = lines[0].fields  # type: ignore[attr-defined]
    assert fields["status"] == 200 and fields["path"] == "/v1/chat/completions"
    assert fields["duration_s"] > 0
    assert (fields["prompt_tokens"], fields["completion_tokens"]) == (7, 3)
