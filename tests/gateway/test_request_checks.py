"""Request bodies checked before any engine sees them, and engines' answers to a client's mistake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.requestbounds import RequestBounds
from llmgw.gateway import Gateway, ModelEntry
from llmgw.gateway.api_errors import normalise_engine_error
from llmgw.gateway.catalog_view import catalog_entries

from .conftest import AUTH, EMBED, MODEL, MemoryEngine

CHAT = "/v1/chat/completions"
RECORDED = Path(__file__).parents[1] / "engines" / "data" / "llamacpp-b11434-client-mistakes.json"
SHA = "a" * 64


def recorded() -> dict[str, dict[str, Any]]:
    data = json.loads(RECORDED.read_text())
    return {answer["case"]: answer for answer in data["answers"]}


async def error_of(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            CHAT,
            {"messages": [{"role": "user", "content": "a"}, {"role": "user"}, {"role": 1}]},
            "messages[2].role",
        ),
        (CHAT, {"messages": [{"role": "user", "content": "a"}], "tools": "x"}, "tools"),
        (CHAT, {"messages": [{"role": "user", "content": "a"}], "temperature": 1e308}, "temperature"),
        (CHAT, {"messages": [{"role": "user", "content": "a"}], "logit_bias": {"1": 1e308}}, "logit_bias.1"),
        ("/v1/completions", {"prompt": "a", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "a", "stop": ["s"] * 10_000}, "stop"),
    ],
)
async def test_a_broken_body_is_refused_with_400_naming_the_field_and_never_forwarded(
    gateway: Gateway,
    engine: MemoryEngine,
    http: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    error = await error_of(await http.post(path, json={"model": MODEL, **body}, headers=AUTH))
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in error["message"]
    assert engine.requests == []


async def test_an_ordinary_body_goes_on_to_the_engine_as_sent(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "x_own": 1}
    response = await http.post(CHAT, json=body, headers=AUTH)
    assert response.status_code == 200
    assert [json.loads(received.body) for received in engine.requests] == [body]


async def test_the_models_own_bounds_apply(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.catalog.put(ModelEntry(MODEL, bounds=RequestBounds(max_logit_bias=1, max_tokens=100)))
    gateway.replicas.set_ready(engine.endpoint)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    bias = await error_of(await http.post(CHAT, json={**chat, "logit_bias": {"1": 1, "2": 1}}, headers=AUTH))
    assert bias["param"] == "logit_bias" and "at most 1" in bias["message"]
    tokens = await error_of(await http.post(CHAT, json={**chat, "max_tokens": 101}, headers=AUTH))
    assert tokens["param"] == "max_tokens" and "ctx_size" in tokens["message"]
    assert (await http.post(CHAT, json={**chat, "max_tokens": 100}, headers=AUTH)).status_code == 200


async def test_an_embeddings_body_is_checked_as_embeddings(http: httpx.AsyncClient) -> None:
    error = await error_of(
        await http.post("/v1/embeddings", json={"model": EMBED, "input": ""}, headers=AUTH)
    )
    assert error["param"] == "input"


def test_the_catalog_carries_the_profiles_limits_and_context_to_models_and_adapters() -> None:
    model = parse_model(
        {
            "name": "small",
            "source": {"sha256": SHA},
            "profile": {"ctx_size": 2048, "request_limits": {"max_stop": 2}},
            "adapters": [{"name": "tone", "sha256": SHA}],
        }
    )
    entries = catalog_entries([model])
    assert [entry.bounds for entry in entries] == [RequestBounds(max_stop=2, max_tokens=2048)] * 2


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        (
            "chat-tools-not-array",
            "invalid_request_body",
            "failed to parse tools: Expected 'tools' to be an array",
        ),
        ("chat-role-not-string", "invalid_request_body", "failed to parse messages: type must be string"),
        ("chat-temperature-string", "invalid_request_body", "field 'temperature': type must be number"),
        ("completion-no-prompt", "invalid_request_body", "key 'prompt' not found"),
        (
            "embeddings-too-large",
            "input_too_long",
            "An input is 201 tokens; the model takes at most its batch (64",
        ),
        ("chat-image-part", "unsupported_input", "The model takes no image input"),
        (
            "chat-too-long",
            "context_length_exceeded",
            "The request is 3031 tokens; the context of one request, the model's ctx_size, is 2048 tokens",
        ),
    ],
)
def test_llama_servers_answers_to_client_mistakes_become_400_in_llmgws_words(
    case: str, code: str, says: str
) -> None:
    answer = recorded()[case]
    status, body = normalise_engine_error(answer["status"], json.dumps(answer["answer"]).encode())
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == code and error["type"] == "invalid_request_error"
    assert says in error["message"] and "json.exception" not in error["message"]


def test_an_engines_own_failure_keeps_its_status_and_message() -> None:
    failed = b'{"error": {"code": 500, "message": "failed to get embeddings", "type": "server_error"}}'
    status, body = normalise_engine_error(500, failed)
    assert status == 500 and json.loads(body)["error"]["message"] == "failed to get embeddings"
    unavailable = b'{"error": {"message": "Loading model", "type": "unavailable_error"}}'
    assert normalise_engine_error(503, unavailable)[0] == 503
    # a 503 stays the engine's, whatever words it carries
    odd = b'{"error": {"message": "[json.exception.parse_error.101] x"}}'
    assert normalise_engine_error(503, odd)[0] == 503


async def test_a_client_mistake_the_engine_answers_500_reaches_the_client_as_400(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    answer = recorded()["chat-role-not-string"]
    engine.error = (500, json.dumps(answer["answer"]).encode())
    gateway.replicas.set_ready(engine.endpoint)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    error = await error_of(await http.post(CHAT, json=body, headers=AUTH))
    assert error["message"].startswith("The engine could not read the request:")
