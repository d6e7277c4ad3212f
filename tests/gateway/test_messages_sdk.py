"""The ``anthropic`` SDK (2.x) against the gateway over a socket, the engine a chat completions stand-in."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from anthropic import AsyncAnthropic

from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.testing.gateway_doubles import RecordingOutbound
from llmgw.testing.serving import serving

from .conftest import MODEL, SECRET, WAIT, FakeEngine

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def gateway(hooks: RecordingOutbound) -> AsyncIterator[Gateway]:
    gw = Gateway(GatewaySettings(request_wait_s=0.3, retry_after_s=5), outbound=hooks)
    gw.keys.add(
        KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", Place(Owner.parse("user:alice")))
    )
    gw.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    yield gw
    await gw.close()


async def test_the_sdk_gets_a_message_and_a_stream(gateway: Gateway, engine: FakeEngine) -> None:
    gateway.feed.replica_ready(engine.endpoint_for(MODEL, "sglang"))  # no Messages API: translated
    async with serving(gateway.asgi_app()) as url:
        sdk = AsyncAnthropic(base_url=url, api_key=SECRET, max_retries=0, timeout=WAIT * 2)
        async with sdk:
            message = await sdk.messages.create(model=MODEL, max_tokens=16, messages=ASK)  # type: ignore[arg-type]
            assert message.content[0].type == "text" and message.content[0].text == engine.replica_id
            assert message.usage.output_tokens == 3
            async with sdk.messages.stream(model=MODEL, max_tokens=16, messages=ASK) as stream:  # type: ignore[arg-type]
                text = "".join([piece async for piece in stream.text_stream])
                final = await stream.get_final_message()
    assert text == "".join(f"{engine.replica_id}-{i} " for i in range(engine.chunks))
    assert final.stop_reason == "end_turn"
