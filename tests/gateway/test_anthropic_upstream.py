"""Chat completions to Messages requests and Messages answers back: the translation's rules."""

from __future__ import annotations

import json

import pytest

from llmgw.gateway.anthropic_upstream import StreamReshaper, chat_completion, messages_request
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.messages_events import sse


def translated(chat: dict[str, object]) -> dict[str, object]:
    path, body, _ = messages_request("m", "/v1/chat/completions", json.dumps(chat).encode(), "claude-x")
    assert path == "/v1/messages"
    return dict(json.loads(body))


def test_images_tool_calls_and_tool_results_become_blocks() -> None:
    request = translated(
        {
            "messages": [
                {"role": "developer", "content": "rules"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            "stop": "END",
            "max_completion_tokens": 7,
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "user": "alice",
        }
    )
    assert (
        request["system"] == "rules" and request["max_tokens"] == 7 and request["stop_sequences"] == ["END"]
    )
    assert request["tool_choice"] == {"type": "tool", "name": "f"} and request["metadata"] == {
        "user_id": "alice"
    }
    user, assistant, tool = request["messages"]  # type: ignore[misc]
    assert user["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    assert assistant["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]
    assert tool == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "42"}],
    }


def test_max_tokens_defaults_because_messages_requires_it() -> None:
    assert translated({"messages": [{"role": "user", "content": "x"}]})["max_tokens"] == 4096


@pytest.mark.parametrize(
    ("path", "chat", "why"),
    [
        ("/v1/embeddings", {"input": "x"}, "chat completions only"),
        ("/v1/chat/completions", {"messages": [], "n": 2}, "set it to 1"),
    ],
)
def test_what_messages_cannot_do_is_a_400_saying_so(path: str, chat: dict[str, object], why: str) -> None:
    with pytest.raises(ApiError) as caught:
        messages_request("m", path, json.dumps(chat).encode(), "claude-x")
    assert caught.value.status == 400 and why in str(caught.value)


def test_a_whole_answer_keeps_text_tool_calls_reason_and_cached_usage() -> None:
    message = {
        "id": "msg_1",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {"q": 1}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 10, "output_tokens": 2},
    }
    chat = chat_completion(message, "catalog-name", 1)
    choice = chat["choices"][0]
    assert chat["model"] == "catalog-name" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "hi"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"q": 1}'}
    assert chat["usage"] == {"prompt_tokens": 13, "completion_tokens": 2, "total_tokens": 15}


def test_events_split_anywhere_reshape_the_same_and_an_error_event_ends_the_stream() -> None:
    events = (
        sse("message_start", {"message": {"id": "m1", "usage": {"input_tokens": 5}}})
        + sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        + sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "yo"}})
        + sse("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    whole = StreamReshaper("m", 1).feed(events)
    reshaper = StreamReshaper("m", 1)
    pieces = b"".join(reshaper.feed(events[i : i + 7]) for i in range(0, len(events), 7))
    assert pieces == whole
    datas = [line for line in whole.split(b"\n") if line.startswith(b"data: ")]
    assert json.loads(datas[1][6:])["choices"][0]["delta"] == {"content": "yo"}
    assert json.loads(datas[2][6:])["error"]["type"] == "overloaded_error"
    assert datas[-1] == b"data: [DONE]" and reshaper.ended
