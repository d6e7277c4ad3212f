"""The ``anthropic`` SDK through llmgw to SmolLM2 on real llama-server: each call the Messages API
page lists (docs/anthropic.md) as served on llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster

pytestmark = pytest.mark.e2e

ASK = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def sdk(cluster: Cluster) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=cluster.url, api_key=cluster.key, max_retries=0, timeout=120)
    with client:
        yield client


def test_create(sdk: anthropic.Anthropic) -> None:
    message = sdk.messages.create(model=DEFAULT_MODEL, max_tokens=8, messages=ASK)  # type: ignore[arg-type]
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 5 and 0 < message.usage.output_tokens <= 8


def test_a_stream_in_anthropics_event_order(sdk: anthropic.Anthropic) -> None:
    with sdk.messages.stream(model=DEFAULT_MODEL, max_tokens=8, messages=ASK) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and kinds.index("content_block_start") < kinds.index(
        "content_block_stop"
    )
    assert final.content[0].type == "text" and final.content[0].text
    assert final.usage.output_tokens > 0


def test_a_system_prompt_and_several_turns(sdk: anthropic.Anthropic) -> None:
    turns = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello Ada."}]},
        {"role": "user", "content": [{"type": "text", "text": "What is my name?"}]},
    ]
    system = "Answer in one word."
    one = sdk.messages.create(model=DEFAULT_MODEL, max_tokens=8, system=system, messages=turns[-1:])  # type: ignore[arg-type]
    message = sdk.messages.create(model=DEFAULT_MODEL, max_tokens=8, system=system, messages=turns)  # type: ignore[arg-type]
    assert message.content[0].type == "text"
    assert message.usage.input_tokens > one.usage.input_tokens  # the earlier turns reached the engine
    default = sdk.messages.count_tokens(model=DEFAULT_MODEL, messages=turns[-1:])  # type: ignore[arg-type]
    assert default.input_tokens != one.usage.input_tokens  # the system prompt replaced the template's own


def test_stop_sequences_end_the_answer(sdk: anthropic.Anthropic) -> None:
    # SmolLM2 greets with "Hello": an "l" comes within the first tokens of any answer to this
    message = sdk.messages.create(model=DEFAULT_MODEL, max_tokens=32, messages=ASK, stop_sequences=["l"])  # type: ignore[arg-type]
    text = message.content[0].text if message.content and message.content[0].type == "text" else ""
    assert "l" not in text
    assert message.stop_reason in ("end_turn", "stop_sequence") and message.usage.output_tokens < 32


def test_tools_are_accepted(sdk: anthropic.Anthropic) -> None:
    tool = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    message = sdk.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=32,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[tool],  # type: ignore[list-item]
    )
    assert message.content and {block.type for block in message.content} <= {"text", "tool_use"}
    for block in message.content:
        if block.type == "tool_use":
            assert block.name == "get_weather" and isinstance(block.input, dict)


def test_count_tokens(sdk: anthropic.Anthropic) -> None:
    short = sdk.messages.count_tokens(model=DEFAULT_MODEL, messages=ASK)  # type: ignore[arg-type]
    longer = sdk.messages.count_tokens(
        model=DEFAULT_MODEL,
        system="You are a careful assistant. "
        * 10,  # longer than the default system prompt SmolLM2's template adds
        messages=ASK,  # type: ignore[arg-type]
    )
    assert 5 < short.input_tokens < longer.input_tokens
    created = sdk.messages.create(model=DEFAULT_MODEL, max_tokens=1, messages=ASK)  # type: ignore[arg-type]
    # Anthropic's usage: input_tokens are those not read from the cache (llama-server's prefix cache)
    read = created.usage.cache_read_input_tokens or 0
    assert created.usage.input_tokens + read == short.input_tokens


def test_errors_in_anthropics_shape(sdk: anthropic.Anthropic, cluster: Cluster) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(model="no-such-model", max_tokens=8, messages=ASK)  # type: ignore[arg-type]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    stranger = anthropic.Anthropic(base_url=cluster.url, api_key="sk-llmgw-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model=DEFAULT_MODEL, max_tokens=8, messages=ASK)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model=DEFAULT_MODEL, max_tokens=-1, messages=ASK)  # type: ignore[arg-type]
    assert "max_tokens" in bad.value.message
