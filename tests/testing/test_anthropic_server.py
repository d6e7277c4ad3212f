"""The Messages API stand-in answers Anthropic's own SDK as the API does: whole, streamed, errors."""

from __future__ import annotations

import anthropic
import pytest

from llmgw.testing.anthropic_server import AnthropicStandin, serving_anthropic


async def test_the_sdk_reads_a_whole_message_and_its_usage() -> None:
    standin = AnthropicStandin()
    async with serving_anthropic(standin) as url:
        sdk = anthropic.AsyncAnthropic(base_url=url, api_key=standin.key, max_retries=0)
        message = await sdk.messages.create(
            model="claude-x", max_tokens=2, system="short", messages=[{"role": "user", "content": "a b c"}]
        )
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Echo: a"  # type: ignore[union-attr]
    assert (message.stop_reason, message.usage.input_tokens, message.usage.output_tokens) == (
        "max_tokens",
        4,
        2,
    )


async def test_the_sdk_streams_the_events_in_anthropics_order() -> None:
    standin = AnthropicStandin()
    async with serving_anthropic(standin) as url:
        sdk = anthropic.AsyncAnthropic(base_url=url, api_key=standin.key, max_retries=0)
        async with sdk.messages.stream(
            model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "one two"}],
            stop_sequences=["two"],
        ) as stream:  # fmt: skip
            kinds = [
                event.type async for event in stream if not event.type.startswith(("text", "input_json"))
            ]
            final = await stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == "Echo: one "  # type: ignore[union-attr]
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "two")


@pytest.mark.parametrize(
    ("setting", "error", "status"),
    [("rate_limited", anthropic.RateLimitError, 429), ("overloaded", anthropic.InternalServerError, 529)],
)
async def test_errors_have_anthropics_shape(
    setting: str, error: type[anthropic.APIStatusError], status: int
) -> None:
    standin = AnthropicStandin(**{setting: True})
    async with serving_anthropic(standin) as url:
        sdk = anthropic.AsyncAnthropic(base_url=url, api_key=standin.key, max_retries=0)
        with pytest.raises(error) as caught:
            await sdk.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == status
    body = caught.value.body
    assert (
        isinstance(body, dict)
        and body["type"] == "error"
        and body["error"]["type"]
        in (
            "rate_limit_error",
            "overloaded_error",
        )
    )


async def test_a_wrong_key_and_a_missing_max_tokens_are_refused() -> None:
    standin = AnthropicStandin()
    async with serving_anthropic(standin) as url:
        wrong = anthropic.AsyncAnthropic(base_url=url, api_key="nope", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            await wrong.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        sdk = anthropic.AsyncAnthropic(base_url=url, api_key=standin.key, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:
            await sdk.messages.create(model="m", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert "max_tokens" in str(caught.value)
