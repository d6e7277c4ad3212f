"""What the admin API refuses, and how: a 4xx in the error shape naming the field, never a 5xx.

Each case here was once a 5xx (or, for ``serving.stopped``, a wrong 200): too
large a number, a string longer than its column, a value of the wrong type, a
body nested too deep, text that is not Unicode. An exception nothing caught is
still a JSON 500 in the error shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.core.health import ComponentHealth
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-test"
JSON = {"content-type": "application/json"}


def broken_components() -> Sequence[ComponentHealth]:
    raise RuntimeError("the supervisor's table is gone")


def no_components() -> Sequence[ComponentHealth]:
    return []


async def admin_client(
    tmp_path: Path, components: Callable[[], Sequence[ComponentHealth]]
) -> AsyncIterator[httpx.AsyncClient]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    admin = admin_api(store, tmp_path, token=TOKEN, components=components)
    transport = httpx.ASGITransport(app=admin.app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield client
    await store.close()


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for made in admin_client(tmp_path, no_components):
        yield made


def problems(answer: httpx.Response) -> list[str]:
    """The fields a refusal names, after checking it is a 4xx in the error shape."""
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:300])
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["message"] and error["hint"], error
    return [p["field"] for p in error.get("problems") or []]


async def test_an_audit_limit_past_any_integer_column_is_clamped(client: httpx.AsyncClient) -> None:
    answer = await client.get("/api/audit", params={"limit": "100000000000000000000"})
    assert answer.status_code == 200
    assert answer.json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "alice", "owner": "o" * 200}, "owner"),
        ({"name": "n" * 129}, "name"),
        ({"name": "alice", "owner": "a\x00b"}, "owner"),
    ],
)
async def test_a_key_field_that_no_column_keeps_is_named(
    client: httpx.AsyncClient, body: dict[str, str], field: str
) -> None:
    answer = await client.post("/api/keys", json=body)
    assert problems(answer) == [field]
    assert (await client.get("/api/keys")).json() == []


async def test_a_key_owner_as_long_as_its_column_is_kept(client: httpx.AsyncClient) -> None:
    answer = await client.post("/api/keys", json={"name": "alice", "owner": "o" * 128})
    assert answer.status_code == 201
    assert (await client.get("/api/keys")).json()[0]["owner"] == "o" * 128


async def test_an_upload_named_longer_than_its_column_is_refused(client: httpx.AsyncClient) -> None:
    answer = await client.post("/api/mirror/blobs", params={"filename": "f" * 513}, content=b"abc")
    assert problems(answer) == ["query.filename"]
    assert (await client.get("/api/mirror/blobs")).json() == []


@pytest.mark.parametrize("value", ["false", 0, None, {"stopped": True}])
async def test_serving_stopped_takes_a_json_bool_only(client: httpx.AsyncClient, value: Any) -> None:
    answer = await client.put("/api/settings/serving.stopped", json={"value": value})
    assert problems(answer) == ["value"]
    assert "JSON bool" in answer.json()["error"]["problems"][0]["problem"]
    assert (await client.get("/api/settings")).json() == {}
    assert (await client.get("/api/status")).json()["stopped"] is False


async def test_serving_stopped_set_to_a_bool_is_kept(client: httpx.AsyncClient) -> None:
    answer = await client.put("/api/settings/serving.stopped", json={"value": False})
    assert answer.status_code == 200
    assert (await client.get("/api/settings")).json() == {"serving.stopped": False}


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_a_body_nested_too_deep_is_a_400_naming_the_body(client: httpx.AsyncClient, depth: int) -> None:
    answer = await client.post("/api/models", content=b"[" * depth + b"]" * depth, headers=JSON)
    assert problems(answer) == ["body"]
    assert "nested too deeply" in answer.json()["error"]["message"]


@pytest.mark.parametrize("raw", [b'{"value": "a\\ud800"}', b'{"value": {"k\\udc00": 1}}'])
async def test_a_setting_holding_a_lone_surrogate_is_refused(client: httpx.AsyncClient, raw: bytes) -> None:
    answer = await client.put("/api/settings/knowledge.embedding_model", content=raw, headers=JSON)
    assert problems(answer) == ["value"]
    assert (await client.get("/api/settings")).status_code == 200
    assert (await client.get("/api/audit")).status_code == 200


async def test_a_setting_key_holding_a_nul_is_refused(client: httpx.AsyncClient) -> None:
    answer = await client.put("/api/settings/a%00b", json={"value": 1})
    assert problems(answer) == ["key"]


async def test_a_method_a_route_does_not_take_is_a_405_naming_the_others(client: httpx.AsyncClient) -> None:
    answer = await client.put("/api/status", json={})
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET"
    assert "PUT is not allowed on /api/status" in answer.json()["error"]["message"]


async def test_an_uncaught_exception_is_a_json_500_in_the_error_shape(tmp_path: Path) -> None:
    async for made in admin_client(tmp_path, broken_components):
        answer = await made.get("/api/status")
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/json"
    assert "RuntimeError" in answer.json()["error"]["message"]
    assert "report it" in answer.json()["error"]["hint"]


async def test_two_authorization_headers_reaching_the_app_are_refused_400(client: httpx.AsyncClient) -> None:
    """What reaches the app past the admission layer (a standby's relayed request) is checked alike."""
    request = client.build_request("GET", "/api/keys")
    request.headers = httpx.Headers([*request.headers.multi_items(), ("authorization", f"Bearer {TOKEN}")])
    answer = await client.send(request)
    assert answer.status_code == 400
    problems(answer)
    assert "more than one Authorization header" in answer.json()["error"]["message"]


async def test_a_setting_llmgw_does_not_read_is_a_400_naming_the_closest(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.put("/api/settings/serving.stoped", json={"value": True})
    assert problems(answer) == ["key"]
    assert "did you mean serving.stopped" in answer.json()["error"]["problems"][0]["problem"]
    assert (await client.get("/api/settings")).json() == {}
    assert (await client.get("/api/status")).json()["stopped"] is False
