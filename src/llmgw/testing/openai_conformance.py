"""What a client of llmgw relies on, checked with the real ``openai`` SDK: one check per SDK call.

Each check drives one call of the SDK through a gateway at a model and
asserts the shape a client's code reads (not the words a model happens to
say): the answer's objects, streaming events in their order, usage, and the
errors. The end-to-end suites run them against real llama-server with
SmolLM2 and against the vLLM, SGLang and TensorRT-LLM stand-ins, so the same
list says which SDK calls pass on each engine (docs/openai.md).
"""

from __future__ import annotations

import json
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour."}]
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
    "additionalProperties": False,
}


def chat(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8)
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0


def chat_stream(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def completion(client: openai.OpenAI, model: str) -> None:
    answer = client.completions.create(model=model, prompt="The sky is", max_tokens=6)
    assert answer.object == "text_completion" and answer.choices[0].text
    assert answer.usage is not None and answer.usage.completion_tokens > 0


def responses(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="Name a colour.", max_output_tokens=16)
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.model == model and response.output_text
    assert response.usage is not None and response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def responses_stream(client: openai.OpenAI, model: str) -> None:
    stream = client.responses.create(model=model, input="Name a colour.", max_output_tokens=16, stream=True)
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
    assert kinds[-1] in ("response.completed", "response.incomplete")


def responses_follow_up(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=8)
    second = client.responses.create(
        model=model, input="What is my name?", previous_response_id=first.id, max_output_tokens=8
    )
    assert second.usage is not None and first.usage is not None
    # The follow-up carried the first turn: its prompt holds more than the new input alone.
    assert second.usage.input_tokens > first.usage.input_tokens


def tools(client: openai.OpenAI, model: str) -> None:
    """Tools pass through: the answer is a tool call or text, as the model's template decides."""
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        max_tokens=32,
    )
    message = answer.choices[0].message
    assert message.tool_calls or message.content


def structured_output(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
        max_tokens=40,
    )
    content = answer.choices[0].message.content or ""
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content).get("name"), str)
    else:  # cut at max_tokens: still JSON as far as it goes
        assert content.lstrip().startswith("{")


def logprobs(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=3,
        logprobs=True,
        top_logprobs=2,
    )
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else None
    assert content and all(token.logprob <= 0 for token in content)


def embeddings(client: openai.OpenAI, model: str) -> None:
    answer = client.embeddings.create(model=model, input=["red", "a red apple"])
    assert [e.index for e in answer.data] == [0, 1]
    assert len(answer.data[0].embedding) == len(answer.data[1].embedding) > 0
    assert answer.usage.prompt_tokens > 0


def rerank(client: openai.OpenAI, model: str) -> None:
    """``/v1/rerank`` through the SDK's generic post (the SDK has no rerank method)."""
    answer = client.post(
        "/rerank",
        body={"model": model, "query": "red fruit", "documents": ["a red apple", "a blue car"]},
        cast_to=dict[str, Any],
    )
    results = answer["results"]
    assert sorted(r["index"] for r in results) == [0, 1]
    best = max(results, key=lambda r: r["relevance_score"])
    assert best["index"] == 0


def refused_for_the_wrong_task(client: openai.OpenAI, chat_model: str) -> None:
    try:
        client.embeddings.create(model=chat_model, input="hi")
    except openai.BadRequestError as error:
        assert error.code == "model_not_supported" and "serves chat" in error.message
    else:
        raise AssertionError("a chat model answered an embeddings request")


CHECKS = {
    "chat.completions.create": chat,
    "chat.completions.create(stream)": chat_stream,
    "completions.create": completion,
    "responses.create": responses,
    "responses.create(stream)": responses_stream,
    "responses.create(previous_response_id)": responses_follow_up,
    "chat.completions.create(tools)": tools,
    "chat.completions.create(json_schema)": structured_output,
    "chat.completions.create(logprobs)": logprobs,
}
"""The checks of a chat model, by the SDK call they make."""
