"""A Responses request as a chat completion, and a chat completion's answer as a Response."""

from __future__ import annotations

import json

import pytest

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.response_store import ResponseStore
from llmgw.gateway.responses_api import ResponsesCall, chat_messages


def test_function_calls_and_their_outputs_become_an_assistant_tool_call_and_a_tool_message() -> None:
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    messages = chat_messages({"instructions": "Be brief."}, items)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert [call["id"] for call in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


def test_content_parts_are_joined_as_text_and_images_kept_as_parts() -> None:
    text_only = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        }
    ]
    assert chat_messages({}, text_only)[0]["content"] == "ab"
    with_image = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what?"},
                {"type": "input_image", "image_url": "data:x"},
            ],
        }
    ]
    parts = chat_messages({}, with_image)[0]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": "data:x"}}


def test_function_tools_text_format_and_limits_are_carried_into_the_chat_request() -> None:
    data = {
        "model": "m",
        "input": "hi",
        "max_output_tokens": 9,
        "top_logprobs": 2,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}},
        "stream": True,
    }
    chat = json.loads(ResponsesCall(data, "k", ResponseStore()).chat_body())
    assert chat["max_tokens"] == 9 and chat["logprobs"] is True and chat["top_logprobs"] == 2
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "p", "schema": {"type": "object"}},
    }
    assert chat["stream_options"] == {"include_usage": True}


async def test_a_cut_answer_is_an_incomplete_response_and_a_tool_call_a_function_call_item() -> None:
    call = ResponsesCall({"model": "m", "input": "hi"}, "k", ResponseStore())
    completion = {
        "choices": [
            {
                "finish_reason": "length",
                "message": {
                    "content": "partial",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    response = json.loads(await call.translated_whole(json.dumps(completion).encode()))
    assert response["status"] == "incomplete" and response["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == "c1"
    assert response["usage"]["input_tokens"] == 3 and response["usage"]["output_tokens"] == 4


@pytest.mark.parametrize(
    "given", [{"input": 3}, {"input": [{"role": "robot", "content": "x"}]}, {"input": [{"type": "mcp_call"}]}]
)
def test_input_the_translation_cannot_carry_is_a_400_naming_it(given: dict[str, object]) -> None:
    with pytest.raises(ApiError) as caught:
        ResponsesCall({"model": "m", **given}, "k", ResponseStore()).chat_body()
    assert caught.value.status == 400
