"""The checks of request bodies: each field's type and range, and the sizes a model takes."""

from __future__ import annotations

import statistics
import timeit
from typing import Any

import pytest

from llmgw.core.catalog import Profile
from llmgw.core.requestbounds import DEFAULT_BOUNDS, RequestBounds, RequestLimits, check_request

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **fields}


def refused_param(route: str, data: dict[str, Any], bounds: RequestBounds = DEFAULT_BOUNDS) -> str | None:
    refusal = check_request(route, data, bounds)
    return None if refusal is None else refusal.param


@pytest.mark.parametrize(
    "data",
    [
        chat(),
        chat(
            max_tokens=16,
            max_completion_tokens=16,
            temperature=0.7,
            top_p=0.9,
            presence_penalty=-2,
            frequency_penalty=2,
            seed=-1,
            logprobs=True,
            top_logprobs=20,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            user="u1",
            stop=["\n", "END"],
            logit_bias={"15": -100, "7": 5.5},
            tool_choice="auto",
            parallel_tool_calls=False,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            response_format={"type": "json_object"},
            temperature_unknown_field=[1, 2],
        ),
        chat(temperature=None, max_tokens=None, stop=None, tools=None),  # null: as not sent
        chat(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
                {"role": "tool", "content": "42", "tool_call_id": "c"},
            ]
        ),
        chat(max_tokens=16.0),  # an integral number is an integer to a JSON reader
    ],
)
def test_ordinary_chat_bodies_pass(data: dict[str, Any]) -> None:
    assert check_request(CHAT, data) is None


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"model": "m"}, "messages"),
        (chat(messages=[]), "messages"),
        (chat(messages="hi"), "messages"),
        (chat(messages=["hi"]), "messages[0]"),
        (chat(messages=[*MESSAGES, {"role": 5, "content": "x"}]), "messages[2].role"),
        (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (chat(messages=[{"content": "x"}]), "messages[0].role"),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (chat(messages=[{"role": "user", "content": [5]}]), "messages[0].content[0]"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
            "messages[0].content[0].text",
        ),
        (chat(messages=[{"role": "user", "content": "x", "name": 3}]), "messages[0].name"),
        (chat(messages=[{"role": "assistant", "tool_calls": "x"}]), "messages[0].tool_calls"),
        (chat(tools="x"), "tools"),
        (chat(tools=[5]), "tools[0]"),
        (chat(tools=[{"function": {"name": "f"}}]), "tools[0].type"),
        (chat(tools=[{"type": "function", "function": {"name": 1}}]), "tools[0].function.name"),
        (
            chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
            "tools[0].function.parameters",
        ),
        (chat(tool_choice="always"), "tool_choice"),
        (chat(tool_choice=1), "tool_choice"),
        (chat(n=0), "n"),
        (chat(n=17), "n"),
        (chat(n="2"), "n"),
        (chat(max_tokens=-1), "max_tokens"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens=1.5), "max_tokens"),
        (chat(max_tokens=True), "max_tokens"),
        (chat(max_completion_tokens=-1), "max_completion_tokens"),
        (chat(temperature=1e308), "temperature"),
        (chat(temperature=-0.1), "temperature"),
        (chat(temperature=float("nan")), "temperature"),
        (chat(temperature="hot"), "temperature"),
        (chat(top_p=1.5), "top_p"),
        (chat(presence_penalty=3), "presence_penalty"),
        (chat(frequency_penalty=-2.5), "frequency_penalty"),
        (chat(seed=1.5), "seed"),
        (chat(seed=2**64), "seed"),
        (chat(logprobs=1), "logprobs"),
        (chat(top_logprobs=21), "top_logprobs"),
        (chat(logit_bias=[[1, 2]]), "logit_bias"),
        (chat(logit_bias={"hello": 1}), "logit_bias"),
        (chat(logit_bias={"-1": 1}), "logit_bias"),
        (chat(logit_bias={"99999999999": 1}), "logit_bias"),
        (chat(logit_bias={"5": 1e308}), "logit_bias.5"),
        (chat(logit_bias={"5": "1"}), "logit_bias.5"),
        (chat(logit_bias={str(i): 1 for i in range(1025)}), "logit_bias"),
        (chat(stop=5), "stop"),
        (chat(stop=["x"] * 17), "stop"),
        (chat(stop=[1]), "stop[0]"),
        (chat(stop="x" * 1025), "stop"),
        (chat(stop=["a", "x" * 1025]), "stop[1]"),
        (chat(stream="yes"), "stream"),
        (chat(stream_options=True), "stream_options"),
        (chat(user=5), "user"),
        (chat(response_format="json"), "response_format"),
        (chat(response_format={}), "response_format.type"),
        (chat(parallel_tool_calls="no"), "parallel_tool_calls"),
    ],
)
def test_broken_chat_bodies_are_refused_naming_the_field(data: dict[str, Any], param: str) -> None:
    assert refused_param(CHAT, data) == param


def test_a_refusal_says_the_bound_and_where_an_operator_sets_it() -> None:
    refusal = check_request(CHAT, chat(logit_bias={str(i): 1 for i in range(2000)}))
    assert refusal is not None
    assert "2000 entries" in refusal.message and "at most 1024" in refusal.message
    assert "max_logit_bias" in refusal.message and refusal.code == "object_above_max_length"
    role = check_request(CHAT, chat(messages=[*MESSAGES, {"role": 5}]))
    assert role is not None and role.message == "'messages[2].role' must be a string, not an integer."
    assert role.code == "invalid_type"
    huge = check_request(CHAT, chat(max_tokens=10**300))
    assert huge is not None and len(huge.message) < 120 and "00000..." in huge.message


def test_max_tokens_above_the_models_context_is_refused_and_unchecked_without_one() -> None:
    bounded = RequestLimits().bounds(ctx_size=2048)
    assert refused_param(CHAT, chat(max_tokens=2048), bounded) is None
    assert refused_param(CHAT, chat(max_tokens=2049), bounded) == "max_tokens"
    assert (
        refused_param(RESPONSES, {"input": "hi", "max_output_tokens": 4096}, bounded) == "max_output_tokens"
    )
    unknown = RequestLimits().bounds(ctx_size=0)
    assert refused_param(CHAT, chat(max_tokens=10**9), unknown) is None
    assert refused_param(CHAT, chat(max_tokens=2**31), unknown) == "max_tokens"


def test_an_operators_limits_replace_the_defaults() -> None:
    bounds = RequestLimits(max_logit_bias=2, max_stop=1, max_n=4, max_tools=0, max_messages=2).bounds()
    assert refused_param(CHAT, chat(logit_bias={"1": 1, "2": 1, "3": 1}), bounds) == "logit_bias"
    assert refused_param(CHAT, chat(logit_bias={"1": 1, "2": 1}), bounds) is None
    assert refused_param(CHAT, chat(stop=["a", "b"]), bounds) == "stop"
    assert refused_param(CHAT, chat(n=5), bounds) == "n"
    assert refused_param(CHAT, chat(tools=[{"type": "function"}]), bounds) == "tools"
    assert refused_param(CHAT, chat(messages=MESSAGES * 2), bounds) == "messages"


def test_a_profile_carries_request_limits_and_refuses_nonsense_ones() -> None:
    profile = Profile(request_limits={"max_logit_bias": 10}, ctx_size=1024)
    assert profile.request_limits.bounds(profile.ctx_size) == RequestBounds(
        max_logit_bias=10, max_tokens=1024
    )
    assert Profile().request_limits == RequestLimits()
    with pytest.raises(ValueError, match="max_n"):
        Profile(request_limits={"max_n": 0})
    with pytest.raises(ValueError, match="max_stops"):
        Profile(request_limits={"max_stops": 3})


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"prompt": "Once"}, None),
        ({"prompt": ["a", "b"], "logprobs": 5, "echo": False, "best_of": 2, "suffix": "."}, None),
        ({"prompt": [1, 2, 3]}, None),
        ({"prompt": [[1, 2], [3]]}, None),
        ({}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": {"a": 1}}, "prompt"),
        ({"prompt": [-1]}, "prompt[0]"),
        ({"prompt": [[1, "x"]]}, "prompt[0][1]"),
        ({"prompt": ["a"] * 2049}, "prompt"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "logprobs": True}, "logprobs"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "best_of": 17}, "best_of"),
        ({"prompt": "x", "echo": "no"}, "echo"),
        ({"prompt": "x", "stop": ["s"] * 10_000}, "stop"),
    ],
)
def test_completion_bodies(data: dict[str, Any], param: str | None) -> None:
    assert refused_param(COMPLETIONS, data) == param


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"input": "text"}, None),
        ({"input": ["a", "b"], "encoding_format": "base64", "dimensions": 8, "user": "u"}, None),
        ({"input": [[1, 2]]}, None),
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": [[]]}, "input[0]"),
        ({"input": {"a": 1}}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
    ],
)
def test_embeddings_bodies(data: dict[str, Any], param: str | None) -> None:
    assert refused_param(EMBEDDINGS, data) == param


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"input": "hi"}, None),
        ({"previous_response_id": "resp_1"}, None),
        (
            {"input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "output": "1"}]},
            None,
        ),
        ({"input": 5}, "input"),
        ({"input": [5]}, "input[0]"),
        ({"input": [{"role": "boss", "content": "hi"}]}, "input[0].role"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "tools": {}}, "tools"),
        ({"input": "hi", "store": "yes"}, "store"),
        ({"input": "hi", "instructions": 1}, "instructions"),
    ],
)
def test_responses_bodies(data: dict[str, Any], param: str | None) -> None:
    assert refused_param(RESPONSES, data) == param


def test_routes_without_checks_pass_anything() -> None:
    assert check_request("/v1/images/generations", {"prompt": 5, "n": "x"}) is None


def median_s(call: Any, runs: int = 5) -> float:
    return statistics.median(timeit.repeat(call, number=1, repeat=runs))


def test_a_million_entry_logit_bias_is_refused_in_under_10_ms() -> None:
    data = chat(logit_bias={str(i): 1 for i in range(1_000_000)})
    assert refused_param(CHAT, data) == "logit_bias"
    assert median_s(lambda: check_request(CHAT, data)) < 0.010


def test_ten_thousand_stop_strings_are_refused_in_under_a_millisecond() -> None:
    data = chat(stop=["x"] * 10_000)
    assert refused_param(CHAT, data) == "stop"
    assert median_s(lambda: check_request(CHAT, data)) < 0.001


@pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
def test_a_rerank_is_checked_for_its_documents_query_and_top_n(route: str) -> None:
    ranked = {"model": "r", "query": "which", "documents": ["a", {"text": "b"}], "top_n": 1}
    assert check_request(route, ranked) is None
    assert refused_param(route, {**ranked, "documents": "a"}) == "documents"
    assert refused_param(route, {**ranked, "documents": ["d"] * 3}, RequestBounds(max_input_items=2)) == (
        "documents"
    )
    assert refused_param(route, {**ranked, "query": ["q"]}) == "query"
    assert refused_param(route, {**ranked, "top_n": 0}) == "top_n"
    assert refused_param(route, {"model": "r", "query": "which"}) == "documents"
