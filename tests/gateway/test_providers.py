"""Provider models over real sockets: an OpenAI-compatible engine and the Anthropic stand-in as providers.

The request path is the cluster's (keys, usage, streaming, limits); what differs is
checked here: the provider's name for the model in the body, its key, the Messages
translation, its timeouts, its 429 passed on with Retry-After, its concurrency cap,
TLS with a test CA, and the metrics and last error kept per provider.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY

from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, hash_secret
from llmgw.testing.anthropic_server import AnthropicStandin, serving_anthropic
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import RecordingOutbound
from llmgw.testing.git_https import self_signed
from llmgw.testing.serving import serving

from .conftest import MESSAGES, SECRET, WAIT, FakeEngine, closed_port

HOSTED = "hosted-chat"
CLAUDE = "hosted-claude"


def provider_model(name: str, base_url: str, key: str, **provider: Any) -> ModelDefinition:
    return parse_model(
        {
            "name": name,
            "provider": {"base_url": base_url, "model": "upstream-" + name, "key": key, **provider},
        }
    )


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def standin() -> AnthropicStandin:
    return AnthropicStandin()


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> GatewaySettings:
    return GatewaySettings(**{"request_wait_s": 0.3, "retry_after_s": 5, **getattr(request, "param", {})})


@pytest.fixture
async def gateway(settings: GatewaySettings, hooks: RecordingOutbound) -> AsyncIterator[Gateway]:
    gw = Gateway(settings, outbound=hooks)  # its own HTTP client
    gw.keys.add(
        KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", Place(Owner.parse("user:alice")))
    )
    yield gw
    await gw.close()


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[AsyncOpenAI]:
    async with serving(gateway.asgi_app()) as url:
        sdk = AsyncOpenAI(base_url=f"{url}/v1", api_key=SECRET, max_retries=0, timeout=WAIT * 2)
        yield sdk
        await sdk.close()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_an_openai_provider_gets_its_own_model_name_and_key_and_usage_is_counted(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.catalog_replaced([provider_model(HOSTED, f"http://127.0.0.1:{engine.port}/v1", engine.key)])
    answer = await client.chat.completions.create(model=HOSTED, messages=MESSAGES)
    assert answer.choices[0].message.content
    [seen] = engine.requests
    assert seen.path == "/v1/chat/completions"
    assert b'"model":"upstream-hosted-chat"' in seen.body
    assert seen.headers["Authorization"] == f"Bearer {engine.key}"
    (record,) = await eventually(lambda: hooks.records)
    assert (record.model, record.prompt_tokens, record.completion_tokens, record.status) == (
        HOSTED,
        7,
        3,
        200,
    )
    assert sample("llmgw_provider_requests_total", model=HOSTED, code="200") >= 1


async def test_a_stream_from_an_openai_provider_asks_for_usage_and_counts_it(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.catalog_replaced([provider_model(HOSTED, f"http://127.0.0.1:{engine.port}/v1", engine.key)])
    stream = await client.chat.completions.create(model=HOSTED, messages=MESSAGES, stream=True)
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in pieces) == "r1-0 r1-1 r1-2 "
    assert b'"include_usage":true' in engine.requests[0].body
    (record,) = await eventually(lambda: hooks.records)
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)


async def test_a_provider_under_a_path_gets_its_routes_under_it(
    gateway: Gateway, client: AsyncOpenAI
) -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"error":{"message":"nothing here"}}'})

    async with serving(app) as url:
        gateway.feed.catalog_replaced([provider_model(HOSTED, f"{url}/openai/v1", "k")])
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model=HOSTED, messages=MESSAGES)
    assert seen == ["/openai/v1/chat/completions"]


async def test_an_anthropic_provider_answers_a_chat_completion_whole(
    gateway: Gateway, standin: AnthropicStandin, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    async with serving_anthropic(standin) as url:
        gateway.feed.catalog_replaced([provider_model(CLAUDE, url, standin.key, api="anthropic")])
        answer = await client.chat.completions.create(
            model=CLAUDE,
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
            max_tokens=20,
        )
    assert answer.choices[0].message.content == "Echo: hello there"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 3)
    [seen] = standin.requests
    assert seen.body["model"] == "upstream-hosted-claude" and seen.body["system"] == "be brief"
    assert seen.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    assert seen.headers["anthropic-version"] == "2023-06-01" and seen.headers["x-api-key"] == standin.key
    assert "Authorization" not in seen.headers
    (record,) = await eventually(lambda: hooks.records)
    assert (record.prompt_tokens, record.completion_tokens) == (4, 3)


async def test_an_anthropic_stream_becomes_chat_chunks_with_usage(
    gateway: Gateway, standin: AnthropicStandin, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    async with serving_anthropic(standin) as url:
        gateway.feed.catalog_replaced([provider_model(CLAUDE, url, standin.key, api="anthropic")])
        stream = await client.chat.completions.create(
            model=CLAUDE,
            messages=[{"role": "user", "content": "one two three"}],
            stream=True,
            max_tokens=3,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Echo: one two"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    (record,) = await eventually(lambda: hooks.records)
    assert (record.prompt_tokens, record.completion_tokens) == (3, 3)


async def test_an_anthropic_tool_call_comes_back_as_a_chat_tool_call(
    gateway: Gateway, standin: AnthropicStandin, client: AsyncOpenAI
) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    async with serving_anthropic(standin) as url:
        gateway.feed.catalog_replaced([provider_model(CLAUDE, url, standin.key, api="anthropic")])
        answer = await client.chat.completions.create(
            model=CLAUDE,
            messages=MESSAGES,
            tools=[tool],
            tool_choice="required",  # type: ignore[list-item]
        )
    [call] = answer.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("lookup", '{"echo": "hi"}')
    assert answer.choices[0].finish_reason == "tool_calls"
    assert standin.requests[0].body["tool_choice"] == {"type": "any"}


async def test_a_provider_429_is_passed_on_with_its_retry_after(
    gateway: Gateway, standin: AnthropicStandin, client: AsyncOpenAI
) -> None:
    standin.rate_limited = True
    async with serving_anthropic(standin) as url:
        gateway.feed.catalog_replaced([provider_model(CLAUDE, url, standin.key, api="anthropic")])
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model=CLAUDE, messages=MESSAGES)
    assert caught.value.response.headers["retry-after"] == "17"
    assert "rate limit" in caught.value.message
    assert sample("llmgw_provider_errors_total", model=CLAUDE, kind="429") >= 1
    assert gateway.providers.health[CLAUDE].last_error.startswith("429 at ")


async def test_a_provider_silent_past_its_first_byte_timeout_is_a_504_saying_what_to_do(
    gateway: Gateway, standin: AnthropicStandin, client: AsyncOpenAI
) -> None:
    standin.delay_s = 3
    async with serving_anthropic(standin) as url:
        slow = provider_model(CLAUDE, url, standin.key, api="anthropic", timeouts={"first_byte_s": 0.2})
        gateway.feed.catalog_replaced([slow])
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=CLAUDE, messages=MESSAGES)
    assert caught.value.status_code == 504
    assert "provider of model 'hosted-claude' sent no answer within 0.2 s; retry" in caught.value.message
    assert sample("llmgw_provider_errors_total", model=CLAUDE, kind="timeout") >= 1


async def test_a_provider_that_refuses_connections_is_a_502_naming_it(
    gateway: Gateway, client: AsyncOpenAI
) -> None:
    gateway.feed.catalog_replaced([provider_model(HOSTED, f"http://127.0.0.1:{closed_port()}/v1", "k")])
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=HOSTED, messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "provider_unreachable"
    assert "'llmgw ctl models' shows the provider's last error" in caught.value.message
    assert "refused" in gateway.providers.health[HOSTED].last_error


async def test_over_its_concurrency_cap_a_request_waits_then_gets_503_busy(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    capped = provider_model(HOSTED, f"http://127.0.0.1:{engine.port}/v1", engine.key, max_concurrency=1)
    gateway.feed.catalog_replaced([capped])
    first = asyncio.create_task(client.chat.completions.create(model=HOSTED, messages=MESSAGES))
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=HOSTED, messages=MESSAGES)
    assert caught.value.status_code == 503 and caught.value.code == "model_busy"
    assert caught.value.response.headers["retry-after"] == "5"
    assert len(engine.requests) == 1
    engine.hold.set()
    assert (await first).choices[0].message.content


@pytest.mark.parametrize("settings", [{"request_wait_s": 5.0}], indirect=True)
async def test_a_request_waiting_at_the_cap_takes_the_slot_freed(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    capped = provider_model(HOSTED, f"http://127.0.0.1:{engine.port}/v1", engine.key, max_concurrency=1)
    gateway.feed.catalog_replaced([capped])
    first = asyncio.create_task(client.chat.completions.create(model=HOSTED, messages=MESSAGES))
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    second = asyncio.create_task(client.chat.completions.create(model=HOSTED, messages=MESSAGES))
    await eventually(lambda: gateway.replicas.model_load(HOSTED).waiting == 1)
    assert len(engine.requests) == 1
    engine.hold.set()
    assert (await first).choices and (await second).choices
    assert len(engine.requests) == 2


@pytest.fixture
def test_ca(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


async def test_a_provider_over_tls_is_trusted_through_the_ca_file(
    test_ca: tuple[Path, ssl.SSLContext], standin: AnthropicStandin, hooks: RecordingOutbound
) -> None:
    cert, context = test_ca
    async with serving_anthropic(standin, tls=context) as url:
        assert url.startswith("https://")
        for ca_file, works in (("", False), (str(cert), True)):
            gateway = Gateway(GatewaySettings(request_wait_s=0.3, provider_ca_file=ca_file), outbound=hooks)
            gateway.keys.add(
                KeyEntry("key-1", "t", hash_secret(SECRET), "user:alice", Place(Owner.parse("user:alice")))
            )
            gateway.feed.catalog_replaced([provider_model(CLAUDE, url, standin.key, api="anthropic")])
            async with serving(gateway.asgi_app()) as served:
                async with httpx.AsyncClient(base_url=served, timeout=WAIT * 2) as http:
                    answer = await http.post(
                        "/v1/chat/completions",
                        headers={"Authorization": f"Bearer {SECRET}"},
                        json={"model": CLAUDE, "messages": MESSAGES},
                    )
            await gateway.close()
            if works:
                assert answer.status_code == 200, answer.text
                assert answer.json()["choices"][0]["message"]["content"] == "Echo: hi"
            else:
                assert answer.status_code == 502 and "TLS failed" in answer.json()["error"]["message"]
                assert "CERTIFICATE_VERIFY_FAILED" in answer.json()["error"]["message"]


async def test_the_key_never_reaches_the_logs(
    gateway: Gateway, client: AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    gateway.feed.catalog_replaced(
        [provider_model(HOSTED, f"http://127.0.0.1:{closed_port()}/v1", "sk-never-logged")]
    )
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(model=HOSTED, messages=MESSAGES)
    assert caplog.records and "sk-never-logged" not in caplog.text
    assert "sk-never-logged" not in repr(gateway.replicas.get("provider:" + HOSTED))


async def test_a_provider_past_its_total_timeout_is_a_504_naming_the_setting(
    gateway: Gateway, engine: FakeEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    slow = provider_model(HOSTED, f"http://127.0.0.1:{engine.port}/v1", engine.key, timeouts={"total_s": 0.3})
    gateway.feed.catalog_replaced([slow])
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=HOSTED, messages=MESSAGES)
    assert caught.value.status_code == 504 and caught.value.code == "request_timeout"
    assert "(0.3 s)" in caught.value.message and "provider.timeouts.total_s" in caught.value.message
    await asyncio.wait_for(engine.dropped.wait(), WAIT)  # the provider's request was closed
    engine.hold.set()


async def test_a_provider_refusing_its_key_is_a_502_for_the_operator_and_the_key_is_not_echoed(
    gateway: Gateway, standin: AnthropicStandin, client: AsyncOpenAI
) -> None:
    async with serving_anthropic(standin) as url:
        gateway.feed.catalog_replaced([provider_model(CLAUDE, url, "sk-wrong-key", api="anthropic")])
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=CLAUDE, messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "provider_auth_failed"
    assert "sk-wrong-key" not in caught.value.response.text
    assert "key was refused" in gateway.providers.health[CLAUDE].last_error


async def test_the_catalog_places_changes_and_removes_provider_entries(gateway: Gateway) -> None:
    first = provider_model(HOSTED, "https://api.example.com/v1", "k1", max_concurrency=2)
    gateway.feed.catalog_replaced([first])
    [entry] = gateway.replicas.ready(HOSTED)
    assert (entry.base_url, entry.capacity, entry.engine) == ("https://api.example.com:443", 2, "provider")
    lease = gateway.replicas.acquire(entry)
    gateway.feed.catalog_replaced(
        [provider_model(HOSTED, "https://api.example.com/v1", "k2", max_concurrency=5)]
    )
    [changed] = gateway.replicas.ready(HOSTED)
    assert (changed.api_key, changed.capacity) == ("k2", 5)
    assert gateway.replicas.in_flight(changed.replica_id) == 1  # the request on it still counted
    lease.release()
    gateway.feed.catalog_replaced([])
    assert gateway.replicas.ready(HOSTED) == [] and len(gateway.replicas) == 0


async def test_the_load_reader_leaves_provider_entries_alone(gateway: Gateway) -> None:
    gateway.feed.catalog_replaced([provider_model(HOSTED, f"http://127.0.0.1:{closed_port()}/v1", "k")])
    await gateway.loads.read_once()
    assert gateway.loads.readings == {}
    assert [load.readable for load in gateway.replicas.loads(HOSTED)] == [True]
