"""Anthropic Messages requests made into chat completions, and chat answers made into messages."""

from __future__ import annotations

import json

import pytest

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.messages_api import anthropic_error_body, chat_body, message_object
from llmgw.gateway.messages_events import ChatToMessageEvents


def test_a_request_with_system_blocks_images_and_sampling_becomes_a_chat_body() -> None:
    body = chat_body(
        {
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    ],
                }
            ],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u"},
        }
    )
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    parts = body["messages"][1]["content"]
    assert parts[0] == {"type": "text", "text": "what is this?"}
    assert parts[1]["image_url"]["url"] == "data:image/png;base64,AAA"
    assert parts[2]["image_url"]["url"] == "https://x/y.png"
    assert (body["temperature"], body["top_p"], body["top_k"], body["stop"]) == (0.5, 0.9, 20, ["END"])
    assert "metadata" not in body and body["max_tokens"] == 64


def test_tool_use_and_tool_results_become_tool_calls_and_tool_messages() -> None:
    body = chat_body(
        {
            "model": "m",
            "max_tokens": 10,
            "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "weather"},
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
                },
            ],
        }
    )
    assistant, tool = body["messages"][1], body["messages"][2]
    call = assistant["tool_calls"][0]
    assert call["id"] == "toolu_1" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    assert body["tools"][0]["function"] == {
        "name": "weather",
        "parameters": {"type": "object"},
        "description": "d",
    }
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "hi"}]}, "messages.0.role"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
        ),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat_body(data)
    assert caught.value.status == 400 and caught.value.param == field and field in caught.value.message


def test_a_streamed_request_asks_the_engine_for_usage() -> None:
    body = chat_body(
        {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    )
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_a_completion_with_a_tool_call_becomes_a_message_with_parsed_input() -> None:
    completion = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "let me look",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7},
    }
    message = message_object(completion, "m")
    assert (
        message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    )
    assert message["content"] == [
        {"type": "text", "text": "let me look"},
        {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Rome"}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 12, "output_tokens": 7}


@pytest.mark.parametrize(
    ("choice", "reason", "sequence"),
    [
        ({"finish_reason": "stop"}, "end_turn", None),
        ({"finish_reason": "length"}, "max_tokens", None),
        ({"finish_reason": "stop", "stop_reason": "END"}, "stop_sequence", "END"),
    ],
)
def test_finish_reasons_become_stop_reasons(
    choice: dict[str, object], reason: str, sequence: str | None
) -> None:
    completion = {"choices": [{**choice, "message": {"content": "ok"}}]}
    message = message_object(completion, "m", ["END"])
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (502, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_errors_take_anthropics_shape(status: int, kind: str) -> None:
    assert json.loads(anthropic_error_body(status, "why")) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def _chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    return (
        b"data: "
        + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()
        + b"\n\n"
    )


def _events(raw: bytes) -> list[dict[str, object]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


async def test_a_streamed_tool_call_becomes_a_tool_use_block_with_input_json_deltas() -> None:
    shaper = ChatToMessageEvents("msg_1", "m", ())
    raw = await shaper.feed(_chunk({"content": "checking"}))
    call = {"index": 0, "id": "c1", "function": {"name": "weather", "arguments": '{"city"'}}
    raw += await shaper.feed(_chunk({"tool_calls": [call]}))
    raw += await shaper.feed(
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "Rome"}'}}]}, "tool_calls")
    )
    raw += await shaper.feed(
        b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}}\n\n'
    )
    raw += await shaper.feed(b"data: [DONE]\n\n") + await shaper.finish()
    events = _events(raw)
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[5]["content_block"] == {"type": "tool_use", "id": "c1", "name": "weather", "input": {}}
    partial = "".join(e["delta"]["partial_json"] for e in events[6:8])  # type: ignore[index]
    assert json.loads(partial) == {"city": "Rome"} and events[6]["index"] == 1
    assert events[9]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[9]["usage"] == {"output_tokens": 9, "input_tokens": 4}


def test_a_stream_the_gateway_ends_ends_with_an_anthropic_error_event() -> None:
    shaper = ChatToMessageEvents("msg_1", "m", ())
    (event,) = _events(shaper.error("over the budget", "tokens_limit_exceeded"))
    assert event == {"type": "error", "error": {"type": "rate_limit_error", "message": "over the budget"}}
