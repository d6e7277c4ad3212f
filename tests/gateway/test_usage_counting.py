"""Usage of streams that end before the engine's usage, and of requests refused before any replica:
counted from the events relayed and the engine's tokenizer, and told with their status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, hash_secret
from llmgw.gateway.usage import UsageRecord, tokens_in
from llmgw.testing.eventually import eventually

from .conftest import AUTH, MESSAGES, MODEL, SECRET, WAIT, MemoryEngine, RecordingOutbound

DATA = Path(__file__).parent.parent / "engines" / "data"
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]
"""The prompt's tokens as the engine's /tokenize gives them here."""
CHAT = {"model": MODEL, "messages": MESSAGES}


def _events(name: str) -> tuple[list[bytes], int]:
    """A recorded stream's events and the completion tokens its engine's usage counted."""
    raw = (DATA / name).read_bytes()
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]
    usage = next(e for e in reversed(events) if b'"usage":{' in e)
    completion = int(usage.split(b'"completion_tokens":')[1].split(b",")[0])
    return events, completion


@pytest.mark.parametrize(
    ("recording", "counted"),
    [
        ("llamacpp-b11434-chat-stream.txt", 60),  # 60 tokens, no end of the answer sent: exact
        ("llamacpp-b11434-completion-stream.txt", 18),  # the 19th token ended the answer: no text
        ("llamacpp-b11434-chat-stream-emoji.txt", 20),  # 60 tokens: 20 emoji of three tokens each
    ],
)
def test_a_recorded_stream_counts_one_token_per_content_event(recording: str, counted: int) -> None:
    events, completion = _events(recording)
    assert sum(tokens_in(e) for e in events) == counted  # event by event
    assert tokens_in(b"".join(events)) == counted  # and in one run
    assert counted <= completion


def test_role_finish_and_empty_events_count_no_token() -> None:
    vllm_first = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    llama_first = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    call = b'{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}'
    tool = b'data: {"choices":[{"index":0,"delta":' + call + b"}]}\n\n"
    assert [tokens_in(e) for e in (vllm_first, llama_first, finish, tool)] == [0, 0, 0, 1]
    assert tokens_in(b'data: {"choices":[{"text":"","finish_reason":"length"}]}\n\n') == 0
    assert tokens_in(b"data: [DONE]\n\n") == 0


def test_a_recorded_responses_stream_counts_its_text_deltas() -> None:
    raw = (DATA / "llamacpp-b11434-responses-stream.txt").read_bytes()
    assert tokens_in(raw.split(b"event: response.output_text.done")[0]) == 3  # its usage: 3 output tokens


async def _told(hooks: RecordingOutbound) -> UsageRecord:
    (record,) = await eventually(lambda: hooks.records, message="the usage was told")
    return record


async def test_a_stream_the_client_closes_counts_what_it_was_sent_and_the_prompts_tokens(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks = 120
    engine.extra["/tokenize"] = {"count": len(PROMPT), "tokens": PROMPT}
    engine.extra["/apply-template"] = {"prompt": "<|im_start|>user\nhi<|im_end|>\n"}
    engine.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    await asyncio.wait_for(anext(aiter(stream)), WAIT)
    await stream.close()
    record = await _told(hooks)
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (499, len(PROMPT), 1)
    asked = engine.requests[-1]
    assert [r.path for r in engine.requests[-2:]] == ["/apply-template", "/tokenize"]  # llama.cpp's
    assert b'"messages"' in engine.requests[-2].body and b'"content"' in asked.body


async def test_a_stream_the_replica_cuts_counts_its_events_and_a_prompt_the_engine_cannot_tokenize_as_0(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks, engine.cut_after = 120, 110
    gateway.replicas.set_ready(engine.endpoint)
    received = 0
    with pytest.raises(openai.APIError):
        async for chunk in await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True):
            received += bool(chunk.choices and chunk.choices[0].delta.content)
    record = await _told(hooks)
    assert received == 110
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (502, 0, 110)


async def test_a_stream_cut_by_its_budget_counts_what_it_relayed_as_the_budget_did(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    place = Place(Owner.parse("project:acme/ml/chat"))
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), None, place)])
    gateway.feed.limits_replaced({"key:key-1": Limits(tokens_per_month=5)})
    engine.chunks = 50
    engine.extra["/tokenize"] = {"tokens": PROMPT}
    engine.extra["/apply-template"] = {"prompt": "<|im_start|>user\nhi<|im_end|>\n"}
    gateway.replicas.set_ready(engine.endpoint)
    answer = await http.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH)
    assert b"tokens_per_month" in answer.content
    record = await _told(hooks)
    sent = answer.content.count(b'"content": "r1-')
    assert (record.status, record.completion_tokens, record.prompt_tokens) == (429, sent, len(PROMPT))
    meter = gateway.limiter.meter("key:key-1")
    assert meter is not None and meter.month_used == sent + len(PROMPT)  # the budget counts the same


async def test_the_prompt_of_an_early_end_reuses_the_count_made_for_routing(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.cut_after = 2
    engine.extra["/tokenize"] = {"tokens": PROMPT}
    engine.extra["/apply-template"] = {"prompt": "<|im_start|>user\nhi<|im_end|>\n"}
    gateway.replicas.set_ready(engine.endpoint)
    prompt = "<|user|> hi"
    first = await gateway.tokenizer.tokens(engine.endpoint, prompt, {"messages": MESSAGES}, b"r")
    assert first == PROMPT and gateway.tokenizer.asked == 1
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError):
        _ = [chunk async for chunk in stream]
    record = await _told(hooks)
    assert (record.prompt_tokens, record.completion_tokens) == (len(PROMPT), 2)
    assert gateway.tokenizer.asked == 1


async def test_a_stream_that_ends_with_the_engines_usage_is_counted_by_it_alone(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks = 4
    engine.extra["/tokenize"] = {"tokens": PROMPT}
    engine.extra["/apply-template"] = {"prompt": "<|im_start|>user\nhi<|im_end|>\n"}
    gateway.replicas.set_ready(engine.endpoint)
    _ = [c async for c in await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)]
    record = await _told(hooks)
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (200, 7, 4)
    assert [r.path for r in engine.requests] == ["/v1/chat/completions"]  # no /tokenize


@pytest.mark.parametrize(
    ("body", "limits", "status"),
    [
        (b"{not json", {}, 400),
        (b'{"model": "nowhere", "messages": []}', {}, 404),
        (None, {"key:key-1": Limits(requests_per_minute=0)}, 429),
        (None, {"key:key-1": Limits(models=frozenset({"other"}))}, 403),
    ],
    ids=["bad-body", "unknown-model", "rate-limit", "forbidden"],
)
async def test_a_request_refused_before_any_replica_is_told_with_its_status_and_no_tokens(
    gateway: Gateway,
    engine: MemoryEngine,
    http: httpx.AsyncClient,
    hooks: RecordingOutbound,
    body: bytes | None,
    limits: dict[str, Limits],
    status: int,
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    alice = Place(Owner.parse("user:alice"))
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), "user:alice", alice)])
    gateway.feed.limits_replaced(limits)
    chat = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % MODEL.encode()
    content = body if body is not None else chat
    answer = await http.post("/v1/chat/completions", content=content, headers=AUTH)
    assert answer.status_code == status
    (record,) = hooks.records
    model = MODEL if status in (403, 429) else ""  # a body without a model, a model the key does not see
    assert (record.key_id, record.model, record.replica_id, record.status) == ("key-1", model, "", status)
    assert (record.prompt_tokens, record.completion_tokens, record.refused) == (0, 0, status)
    assert hooks.used == [] and engine.requests == []


async def test_a_request_no_replica_could_take_is_told_refused_503(
    gateway: Gateway, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    answer = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert answer.status_code == 503
    assert [(r.model, r.refused) for r in hooks.records] == [(MODEL, 503)]


async def test_a_request_without_a_known_key_tells_no_usage(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    answer = await http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-nope"})
    assert answer.status_code == 401
    assert hooks.records == []
