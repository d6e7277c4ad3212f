"""A Messages request to an engine serving the Messages API itself (llama.cpp, vLLM): sent as it came.

The in-memory engine answers ``/v1/messages`` in llama-server b11434's shape; the recorded stream of the
real one (tests/engines/data/llamacpp-b11434-messages-stream.txt) passes through the same shaping.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from llmgw.gateway import Gateway
from llmgw.gateway.messages_native import NativeMessages
from llmgw.gateway.usage import EventFramer, cached_count, names_prompt, token_counts
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import RecordingOutbound

from .conftest import MODEL, MemoryEngine
from .test_messages_route import ANTHROPIC, ASK, events_of

RECORDED = Path(__file__).parents[1] / "engines" / "data"


async def test_a_whole_message_is_the_engines_own_with_the_catalogs_model_and_id(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)  # llama.cpp
    answer = await http.post("/v1/messages", json=ASK, headers=ANTHROPIC)
    assert answer.status_code == 200, answer.text
    sent = engine.requests[0]
    assert sent.path == "/v1/messages" and json.loads(sent.body) == ASK
    message = answer.json()
    assert message["model"] == MODEL and message["id"].startswith("msg_")
    assert message["content"] == [{"type": "text", "text": engine.replica_id}]
    (record,) = await eventually(lambda: hooks.records)
    assert (record.prompt_tokens, record.completion_tokens, record.status) == (7, 3, 200)


async def test_a_stream_is_the_engines_events_with_message_start_renamed(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    answer = await http.post("/v1/messages", json={**ASK, "stream": True}, headers=ANTHROPIC)
    assert answer.status_code == 200 and engine.requests[0].path == "/v1/messages"
    events = events_of(answer.text)
    kinds = [kind for kind, _ in events]
    assert kinds == (
        ["message_start", "content_block_start"]
        + ["content_block_delta"] * engine.chunks
        + ["content_block_stop", "message_delta", "message_stop"]
    )
    start = events[0][1]["message"]
    assert start["model"] == MODEL and start["id"].startswith("msg_")  # type: ignore[index]
    (record,) = await eventually(lambda: hooks.records)
    assert (record.prompt_tokens, record.completion_tokens) == (7, engine.chunks)


async def test_the_recorded_llama_server_stream_passes_as_it_came_but_for_its_model_and_id() -> None:
    recorded = (RECORDED / "llamacpp-b11434-messages-stream.txt").read_bytes()
    shaper = NativeMessages(MODEL).events()
    framer = EventFramer()
    out = b""
    for piece in (recorded[:200], recorded[200:900], recorded[900:]):  # as it may arrive
        out += await shaper.feed(framer.feed(piece))
    out += await shaper.feed(framer.flush()) + await shaper.finish()
    before, after = recorded.split(b"\n\n"), out.split(b"\n\n")
    assert len(before) == len(after) and before[1:] == after[1:]
    start = json.loads(after[0].split(b"data: ", 1)[1])["message"]
    assert start["model"] == MODEL and start["id"].startswith("msg_") and start["usage"]["input_tokens"] == 32
    assert token_counts(framer.usage) == (32, 6)  # message_start's input, message_delta's output


async def test_the_recorded_whole_message_keeps_all_but_its_model_and_id() -> None:
    recorded = (RECORDED / "llamacpp-b11434-messages-whole.json").read_bytes()
    shaped = json.loads(await NativeMessages(MODEL).whole(recorded))
    original = json.loads(recorded)
    assert shaped["model"] == MODEL and shaped["id"].startswith("msg_")
    assert {k: v for k, v in shaped.items() if k not in ("model", "id")} == {
        k: v for k, v in original.items() if k not in ("model", "id")
    }
    assert token_counts(shaped["usage"]) == (19, 12)


def test_a_messages_usage_counts_the_prompt_read_from_the_cache_too() -> None:
    usage = {"cache_read_input_tokens": 24, "input_tokens": 9, "output_tokens": 1}  # llama-server's
    assert token_counts(usage) == (33, 1) and cached_count(usage) == 24  # priced at the cached price
    vllm = {
        "input_tokens": 5,
        "cache_read_input_tokens": 16,
        "cache_creation_input_tokens": 2,
        "output_tokens": 4,
    }
    assert token_counts(vllm) == (23, 4)
    assert token_counts({"prompt_tokens": 33, "completion_tokens": 1, "cache_read_input_tokens": 24}) == (
        33,
        1,
    )


async def test_a_recorded_stream_that_lost_its_message_start_gets_one_and_its_prompt_is_counted_apart() -> (
    None
):
    """llama-server b11434 drops message_start when its first token is a piece of a character."""
    recorded = (RECORDED / "llamacpp-b11434-messages-stream-emoji.txt").read_bytes()
    assert b"message_start" not in recorded
    shaper = NativeMessages(MODEL).events()
    framer = EventFramer()
    out = await shaper.feed(framer.feed(recorded)) + await shaper.feed(framer.flush())
    first, rest = out.split(b"\n\n", 1)
    start = json.loads(first.split(b"data: ", 1)[1])
    assert first.startswith(b"event: message_start\n") and start["message"]["model"] == MODEL
    assert rest == recorded  # every event the engine sent, as it sent it
    assert not names_prompt(framer.usage)  # the forwarding then counts the prompt by the tokenizer
    assert names_prompt({"input_tokens": 3}) and names_prompt({"prompt_tokens": 3})
