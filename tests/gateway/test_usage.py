"""Usage found in answers, SSE framing, and engines' errors in OpenAI's shape."""

from __future__ import annotations

import json

from llmgw.gateway.api_errors import normalise_engine_error
from llmgw.gateway.usage import EventFramer, find_usage, token_counts


def test_usage_is_found_at_the_end_of_a_json_answer() -> None:
    body = json.dumps(
        {"choices": [{"message": {"content": '"usage": {"x": 1}'}}], "usage": {"prompt_tokens": 3}}
    )
    assert find_usage(body.encode()) == {"prompt_tokens": 3}


def test_no_usage_or_null_usage_is_none() -> None:
    assert find_usage(b'{"choices": []}') is None
    assert find_usage(b'data: {"usage": null}\n\n') is None
    assert token_counts(None) == (0, 0)


def test_the_framer_passes_on_only_complete_events() -> None:
    framer = EventFramer()
    assert framer.feed(b'data: {"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert framer.mid_event
    assert framer.feed(b": 2}\n\n") == b'data: {"b": 2}\n\n'
    assert not framer.mid_event
    assert framer.feed(b"data: [DONE]\r\n\r\n") == b"data: [DONE]\r\n\r\n"


def test_the_framer_keeps_the_last_usage_even_when_split_across_chunks() -> None:
    framer = EventFramer()
    framer.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\ndata: {"choices": [], "us')
    framer.feed(b'age": {"prompt_tokens": 5, "completion_tokens": 9}}\n\n')
    assert token_counts(framer.usage) == (5, 9)


def test_the_framer_flushes_an_unterminated_last_event() -> None:
    framer = EventFramer()
    assert framer.feed(b"data: [DONE]") == b""
    assert framer.flush() == b"data: [DONE]"


def error(status: int, body: bytes) -> dict[str, object]:
    kept, answer = normalise_engine_error(status, body)
    assert kept == status
    shaped = json.loads(answer)
    assert set(shaped) == {"error"}
    result: dict[str, object] = shaped["error"]
    return result


def test_openai_shaped_errors_keep_their_fields() -> None:
    body = b'{"error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "too_many"}}'
    assert error(400, body) == {
        "message": "bad",
        "type": "invalid_request_error",
        "param": "n",
        "code": "too_many",
    }


def test_llama_server_errors_lose_their_numeric_code() -> None:
    body = b'{"error": {"code": 400, "message": "context too long", "type": "invalid_request_error"}}'
    assert error(400, body) == {
        "message": "context too long",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_flat_vllm_and_fastapi_errors_are_nested() -> None:
    assert (
        error(400, b'{"object": "error", "message": "m", "type": "BadRequestError", "code": 400}')["message"]
        == "m"
    )
    detail = b'{"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]}'
    assert error(422, detail) == {
        "message": "messages: Field required",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_plain_text_and_empty_errors_get_a_message() -> None:
    assert error(500, b"Internal Server Error")["message"] == "Internal Server Error"
    assert error(502, b"") == {
        "message": "The replica answered HTTP 502 without a message.",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def test_llama_servers_context_exceeded_names_the_setting_to_raise() -> None:
    body = (
        b'{"error": {"code": 400, "message": "the request exceeds the available context size,'
        b' try increasing it",'
        b' "type": "exceed_context_size_error", "n_prompt_tokens": 700, "n_ctx": 512}}'
    )
    shaped = error(400, body)
    assert shaped["type"] == "invalid_request_error"
    assert shaped["code"] == "context_length_exceeded"
    assert str(shaped["message"]) == (
        "the request exceeds the available context size, try increasing it: the prompt is 700 tokens;"
        " the context of one request, the model's ctx_size, is 512 tokens"
    )
    assert "ctx_size, the context of one request" in str(shaped["hint"])


def test_vllms_maximum_context_length_names_the_setting_to_raise() -> None:
    body = (
        b'{"object": "error", "message": "This model\'s maximum context length is 2048 tokens. However, you'
        b' requested 2100 tokens.", "type": "BadRequestError", "param": null, "code": 400}'
    )
    shaped = error(400, body)
    assert shaped["code"] == "context_length_exceeded"
    assert str(shaped["message"]).startswith("This model's maximum context length is 2048 tokens.")
    assert "ctx_size" in str(shaped["hint"])
