"""Usage in streams: counted whether or not the client asked, shown only when it did."""

from __future__ import annotations

import asyncio
import json

from openai import AsyncOpenAI

from llmgw.gateway import Gateway
from llmgw.gateway.bodies import asking_for_usage, model_and_stream
from llmgw.gateway.usage import EventFramer, without_usage_only_events
from llmgw.testing.eventually import eventually

from .conftest import MESSAGES, MODEL, MemoryEngine, RecordingOutbound

USAGE_EVENT = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
CONTENT_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


async def test_a_stream_the_client_asked_no_usage_of_is_counted_and_the_usage_event_withheld(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks = 4
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    assert [c.choices[0].delta.content for c in chunks] == ["r1-0 ", "r1-1 ", "r1-2 ", "r1-3 "]
    assert all(c.usage is None for c in chunks)
    assert json.loads(engine.requests[0].body)["stream_options"] == {"include_usage": True}
    await eventually(lambda: hooks.records, message="the usage was told")
    assert (hooks.records[0].prompt_tokens, hooks.records[0].completion_tokens) == (7, 4)


async def test_a_client_asking_for_usage_gets_the_usage_event_and_its_body_unchanged(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    sent = {"model": MODEL, "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    assert json.loads(engine.requests[0].body) == sent
    await eventually(lambda: hooks.records, message="the usage was told")
    assert hooks.records[0].completion_tokens == 3


def test_asking_for_usage_splices_bytes_when_the_client_sent_no_stream_options() -> None:
    body = b' {"model": "m", "stream": true, "messages": []}'
    asked = asking_for_usage(body, model_and_stream(body))
    assert asked == b' {"stream_options":{"include_usage":true},"model": "m", "stream": true, "messages": []}'
    assert model_and_stream(asked).usage_asked


def test_asking_for_usage_keeps_the_clients_other_stream_options() -> None:
    for options in ('{"include_usage": false, "continuous_usage_stats": true}', "null"):
        body = f'{{"model": "m", "stream": true, "stream_options": {options}}}'.encode()
        data = json.loads(asking_for_usage(body, model_and_stream(body)))
        assert data["stream_options"]["include_usage"] is True
        assert data["stream_options"].get("continuous_usage_stats", True) is True


def test_stream_options_that_are_no_object_are_left_for_the_engine_to_refuse() -> None:
    body = b'{"model": "m", "stream": true, "stream_options": "yes"}'
    assert asking_for_usage(body, model_and_stream(body)) == body


def test_only_usage_only_events_are_withheld() -> None:
    with_usage = b'data: {"choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":1}}\n\n'
    data = CONTENT_EVENT + with_usage + USAGE_EVENT + b"data: [DONE]\n\n"
    assert without_usage_only_events(data) == CONTENT_EVENT + with_usage + b"data: [DONE]\n\n"
    crlf = USAGE_EVENT.replace(b"\n", b"\r\n")
    assert without_usage_only_events(CONTENT_EVENT + crlf) == CONTENT_EVENT


def test_the_framer_reads_the_usage_it_withholds_even_split_across_chunks() -> None:
    framer = EventFramer(strip_usage_only=True)
    out = framer.feed(CONTENT_EVENT + USAGE_EVENT[:20])
    out += framer.feed(USAGE_EVENT[20:] + b"data: [DONE]\n\n")
    assert out == CONTENT_EVENT + b"data: [DONE]\n\n"
    assert framer.usage == {"prompt_tokens": 7, "completion_tokens": 2}


async def test_a_stream_reports_its_time_to_first_token_and_its_generation_time(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.chunks = 3
    engine.hold_after_first = asyncio.Event()
    gateway.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    chunks = [await anext(aiter(stream))]
    engine.hold_after_first.set()  # the rest comes only once the first event reached the client
    chunks += [chunk async for chunk in stream]
    assert len(chunks) == 3
    await eventually(lambda: hooks.records, message="the usage was told")
    record = hooks.records[0]
    assert record.ttft_s is not None and 0 < record.ttft_s < record.duration_s
    assert record.generation_s > 0
    assert abs(record.ttft_s + record.generation_s - record.duration_s) < 1e-6
    assert record.place == "user:alice"


async def test_an_answer_sent_whole_has_no_first_token_and_generates_for_its_whole_duration(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await eventually(lambda: hooks.records, message="the usage was told")
    record = hooks.records[0]
    assert record.ttft_s is None
    assert record.generation_s == record.duration_s
    assert record.place == "user:alice"
