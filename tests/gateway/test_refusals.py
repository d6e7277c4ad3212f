"""Requests the gateway refuses itself: each in OpenAI's error shape, with a status that fits."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY

from llmgw.gateway import Gateway
from llmgw.gateway.app import Gateway as GatewayApp

from .conftest import AUTH, MESSAGES, MODEL, MemoryEngine, memory_sdk

CHAT = "/v1/chat/completions"


async def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


async def test_a_wrong_key_is_refused_with_401(gateway: Gateway) -> None:
    sdk = memory_sdk(gateway.asgi_app(), "sk-wrong")
    with pytest.raises(openai.AuthenticationError) as caught:
        await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)
    await sdk.close()
    assert caught.value.code == "invalid_api_key"


@pytest.mark.parametrize("header", [None, "Bearer", "Basic abc", "Bearer  "])
async def test_a_missing_or_malformed_authorization_is_refused_with_401(
    http: httpx.AsyncClient, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    response = await http.post(CHAT, json={"model": MODEL}, headers=headers)
    assert response.status_code == 401
    assert (await error_of(response))["code"] == "invalid_api_key"


async def test_an_unknown_model_is_refused_with_404(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    assert caught.value.code == "model_not_found"
    assert "The model 'nope' does not exist; GET /v1/models lists the models" in caught.value.message


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"model": "tiny-chat", ', "not valid JSON"),
        (b"", "empty"),
        (b"[1, 2]", "an array"),
        (b'"text"', "a string"),
        (b"\xff\xfe\x00", "not valid JSON"),
    ],
)
async def test_a_body_that_is_no_json_object_is_refused_with_400(
    http: httpx.AsyncClient, body: bytes, says: str
) -> None:
    response = await http.post(CHAT, content=body, headers=AUTH)
    assert response.status_code == 400
    assert says in (await error_of(response))["message"]


@pytest.mark.parametrize("body", [b"{}", b'{"model": 3}', b'{"model": ""}'])
async def test_a_body_without_a_model_name_is_refused_with_400_naming_the_param(
    http: httpx.AsyncClient, body: bytes
) -> None:
    response = await http.post(CHAT, content=body, headers=AUTH)
    assert response.status_code == 400
    assert (await error_of(response))["param"] == "model"


@pytest.mark.parametrize("settings", [{"max_body_bytes": 64}], indirect=True)
async def test_a_body_over_the_limit_is_refused_with_413(http: httpx.AsyncClient) -> None:
    body = b'{"model": "tiny-chat", "prompt": "' + b"x" * 100 + b'"}'
    response = await http.post("/v1/completions", content=body, headers=AUTH)
    assert response.status_code == 413


async def test_a_stopped_cluster_answers_every_post_with_503_system_stopped(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.feed.replica_ready(engine.endpoint)
    gateway.feed.set_stopped(True)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.embeddings.create(model=MODEL, input="hi")
    assert caught.value.status_code == 503
    assert caught.value.code == "system_stopped"
    assert "llmgw start" in caught.value.body["hint"]  # type: ignore[index]
    assert engine.requests == []


async def test_a_stopped_cluster_refuses_a_post_to_any_v1_path_and_serves_again_when_started(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient
) -> None:
    gateway.feed.replica_ready(engine.endpoint)
    gateway.feed.set_stopped(True)
    response = await http.post("/v1/images/edits", json={}, headers=AUTH)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["type"]) == (503, "system_stopped", "server_error")
    gateway.feed.set_stopped(False)
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers=AUTH)
    assert response.status_code == 200


async def test_an_unknown_route_is_404_and_a_wrong_method_405(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/images/edits", json={}, headers=AUTH)
    assert response.status_code == 404
    assert "Invalid URL (POST /v1/images/edits)" in (await error_of(response))["message"]
    response = await http.get(CHAT, headers=AUTH)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    await error_of(response)


async def test_every_answer_carries_a_request_id(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/models", headers=AUTH | {"x-request-id": "abc-1"})
    assert response.headers["x-request-id"] == "abc-1"
    response = await http.post(CHAT, content=b"[", headers=AUTH)
    assert len(response.headers["x-request-id"]) == 32
    response = await http.get("/nowhere")
    assert response.headers["x-request-id"]


async def test_an_engine_error_keeps_its_status_in_openai_shape(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.error = (
        400,
        b'{"object": "error", "message": "max_tokens too large", "type": "BadRequestError"}',
    )
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.body == {
        "message": "max_tokens too large",
        "type": "BadRequestError",
        "param": None,
        "code": None,
    }


async def test_an_engine_error_on_a_stream_request_is_a_json_error(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.error = (503, b"Loading model")
    gateway.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert caught.value.status_code == 503
    assert caught.value.body == {
        "message": "Loading model",
        "type": "server_error",
        "param": None,
        "code": None,
    }


async def test_a_replica_refusing_the_gateway_key_is_a_502_not_a_401(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(dataclasses.replace(engine.endpoint, api_key="stale"))
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.status_code == 502
    assert caught.value.code == "replica_auth_failed"


async def test_models_lists_the_catalog_for_a_valid_key(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    listing = await client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in listing.data] == [
        ("lazy-chat", "model", "llmgw"),
        ("tiny-chat", "model", "llmgw"),
        ("tiny-embed", "model", "llmgw"),
        ("tiny-rerank", "model", "llmgw"),
    ]
    assert (await client.models.retrieve(MODEL)).created == 1700000000
    response = await http.get("/v1/models")
    assert response.status_code == 401


async def test_requests_are_counted_by_model_project_and_status(client: AsyncOpenAI) -> None:
    labels = {"model": "", "project": "user:alice", "code": "404"}
    before = REGISTRY.get_sample_value("llmgw_gateway_requests_total", labels) or 0.0
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    assert REGISTRY.get_sample_value("llmgw_gateway_requests_total", labels) == before + 1
    assert REGISTRY.get_sample_value("llmgw_gateway_requests_in_flight") == 0


def test_the_gateway_is_its_own_asgi_app() -> None:
    gateway = GatewayApp()
    assert gateway.asgi_app() is gateway
