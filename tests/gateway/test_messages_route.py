"""POST /v1/messages on the gateway: Anthropic's Messages API translated for a chat engine stand-in.

The replica is an SGLang one (``CHAT_ONLY``), whose engine serves no Messages API: the request goes
as a chat completion. Engines that serve it are sent it as it came (test_messages_native.py)."""

from __future__ import annotations

import json

import httpx

from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, hash_secret

from .conftest import MODEL, SECRET, MemoryEngine

ANTHROPIC = {"x-api-key": SECRET, "anthropic-version": "2023-06-01"}
ASK = {
    "model": MODEL,
    "max_tokens": 16,
    "system": "be brief",
    "messages": [{"role": "user", "content": "hi"}],
}
PROJECT = "project:acme/ml/chat"
CHAT_ONLY = "sglang"


def limited(gateway: Gateway, limits: dict[str, Limits]) -> None:
    place = Place(Owner.parse(PROJECT))
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), None, place)])
    gateway.feed.limits_replaced(limits)


def events_of(text: str) -> list[tuple[str, dict[str, object]]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def test_a_whole_answer_is_an_anthropic_message_and_the_engine_is_asked_a_chat_completion(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    answer = await http.post("/v1/messages", json=ASK, headers=ANTHROPIC)
    assert answer.status_code == 200, answer.text
    message = answer.json()
    assert message["id"].startswith("msg_") and message["type"] == "message"
    assert message["content"] == [{"type": "text", "text": engine.replica_id}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 3}
    sent = engine.requests[0]
    assert sent.path == "/v1/chat/completions"
    chat = json.loads(sent.body)
    assert chat["messages"][0] == {"role": "system", "content": "be brief"} and chat["max_tokens"] == 16


async def test_a_bearer_key_is_taken_too(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    answer = await http.post("/v1/messages", json=ASK, headers={"Authorization": f"Bearer {SECRET}"})
    assert answer.status_code == 200 and answer.json()["type"] == "message"


async def test_a_stream_comes_as_anthropics_events_in_their_order(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    answer = await http.post("/v1/messages", json={**ASK, "stream": True}, headers=ANTHROPIC)
    assert answer.status_code == 200
    events = events_of(answer.text)
    kinds = [kind for kind, _ in events]
    deltas = engine.chunks
    assert kinds == (
        ["message_start", "ping", "content_block_start"]
        + ["content_block_delta"] * deltas
        + ["content_block_stop", "message_delta", "message_stop"]
    )
    assert all(data["type"] == kind for kind, data in events)
    text = "".join(str(data["delta"]["text"]) for kind, data in events if kind == "content_block_delta")  # type: ignore[index]
    assert text == "".join(f"{engine.replica_id}-{i} " for i in range(deltas))
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"] == {"output_tokens": deltas, "input_tokens": 7}


async def test_tokens_of_a_message_count_against_the_budget_like_a_chat(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    limited(gateway, {"team:acme/ml": Limits(tokens_per_day=15)})
    for _ in range(2):
        ok = await http.post("/v1/messages", json=ASK, headers=ANTHROPIC)
        assert ok.status_code == 200
    meter = gateway.limiter.meter("team:acme/ml")
    assert meter is not None and meter.day_used == 20


async def test_a_request_over_the_rate_is_a_rate_limit_error_with_retry_after(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    limited(gateway, {PROJECT: Limits(requests_per_minute=1)})
    assert (await http.post("/v1/messages", json=ASK, headers=ANTHROPIC)).status_code == 200
    refused = await http.post("/v1/messages", json=ASK, headers=ANTHROPIC)
    assert refused.status_code == 429
    assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1
    assert len(engine.requests) == 1


async def test_errors_take_anthropics_shape(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    unknown = await http.post("/v1/messages", json=ASK, headers={"x-api-key": "sk-wrong"})
    assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "authentication_error"
    no_max = await http.post(
        "/v1/messages", json={k: v for k, v in ASK.items() if k != "max_tokens"}, headers=ANTHROPIC
    )
    assert no_max.status_code == 400
    assert (
        no_max.json()["error"]["type"] == "invalid_request_error"
        and "max_tokens" in no_max.json()["error"]["message"]
    )
    missing = await http.post("/v1/messages", json={**ASK, "model": "no-such-model"}, headers=ANTHROPIC)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert engine.requests == []


async def test_count_tokens_counts_the_translated_chat_with_the_engines_tokenizer(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    engine.extra["/apply-template"] = {"prompt": "<|im_start|>system\nbe brief<|im_end|>\n"}
    engine.extra["/tokenize"] = {"tokens": [1, 2, 3, 4, 5]}
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    asked = {k: v for k, v in ASK.items() if k != "max_tokens"}
    counted = await http.post("/v1/messages/count_tokens", json=asked, headers=ANTHROPIC)
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"input_tokens": 5}
    rendered = json.loads(engine.requests[0].body)
    assert rendered["messages"][0] == {"role": "system", "content": "be brief"}


async def test_count_tokens_without_a_ready_replica_says_so_in_anthropics_shape(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    refused = await http.post("/v1/messages/count_tokens", json=ASK, headers=ANTHROPIC)
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "api_error" and MODEL in refused.json()["error"]["message"]


async def test_count_tokens_holds_the_chat_bounds_before_any_engine_is_asked(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint_for(MODEL, CHAT_ONLY))
    many = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 5000}  # past max_messages
    refused = await http.post("/v1/messages/count_tokens", json=many, headers=ANTHROPIC)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "messages" in refused.json()["error"]["message"]
    assert engine.requests == []
