"""The gateway's request metrics, scraped from the process registry after requests through the gateway."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY

from llmgw.cli.output import JsonFormatter
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.metrics import project_of
from llmgw.testing.asgi_client import asgi_client
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream, RecordingOutbound

from .conftest import AUTH, MESSAGES, MODEL, SECRET

PROJECT = "user:alice"
"""Where the test key sits (a user's key)."""


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def answered() -> float:
    """Requests of the test key answered 200."""
    return sample("llmgw_gateway_requests_total", model=MODEL, project=PROJECT, code="200")


def test_a_request_counts_under_the_project_or_user_its_key_sits_at() -> None:
    at_project = Place(Owner.parse("project:acme/ml/chat"))
    assert project_of(KeyEntry("k", "n", "h", "a label", at_project)) == "project:acme/ml/chat"
    assert project_of(KeyEntry("k", "n", "h", "a label")) == ""  # no place: public models only
    assert project_of(None) == ""


async def test_an_answered_request_is_counted_timed_and_its_tokens_added_by_model_and_project(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
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
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
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
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    first = sample("llmgw_gateway_time_to_first_token_seconds_count", model=MODEL)
    requests = answered()

    await client.chat.completions.create(model=MODEL, messages=MESSAGES)

    await eventually(lambda: answered() == requests + 1)
    assert sample("llmgw_gateway_time_to_first_token_seconds_count", model=MODEL) == first


@pytest.mark.parametrize(
    ("settings", "access_log"),
    [({"access_log": True}, True), ({"access_log": False}, False)],
    indirect=["settings"],
)
async def test_the_access_log_has_one_line_per_request_only_when_asked(
    access_log: bool,
    gateway: Gateway,
    engine: MemoryEngine,
    client: AsyncOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
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


async def test_a_json_access_line_carries_the_request_project_model_and_replica(
    settings: GatewaySettings, engine: MemoryEngine, upstream: MemoryUpstream, hooks: RecordingOutbound
) -> None:
    gateway = Gateway(settings.model_copy(update={"access_log": True}), upstream=upstream, outbound=hooks)
    gateway.keys.add(KeyEntry("key-1", "tests", hash_secret(SECRET), PROJECT, Place(Owner.parse(PROJECT))))
    gateway.catalog.replace([ModelEntry(MODEL)])
    gateway.replicas.set_ready(engine.endpoint)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger("llmgw.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        async with asgi_client(gateway.asgi_app()) as http:
            body = {"model": MODEL, "messages": MESSAGES}
            headers = {**AUTH, "x-request-id": "req-42"}
            answer = await http.post("/v1/chat/completions", json=body, headers=headers)
            assert answer.status_code == 200
            await eventually(out.getvalue, message="the access line is written")
    finally:
        access.removeHandler(handler)
        await gateway.close()

    (line,) = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["logger"] == "llmgw.access" and entry["level"] == "info"
    assert (entry["request_id"], entry["project"], entry["model"], entry["replica"]) == (
        "req-42",
        PROJECT,
        MODEL,
        engine.replica_id,
    )
    assert (entry["status"], entry["prompt_tokens"], entry["completion_tokens"]) == (200, 7, 3)
