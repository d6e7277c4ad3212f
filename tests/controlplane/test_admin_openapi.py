"""The admin API's OpenAPI description: every /api route says what it takes and what it answers."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store

ERROR_STATUSES = {"400", "401", "404", "409", "503"}


@pytest.fixture
async def openapi(tmp_path: Path) -> dict[str, Any]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)

    async def keys_changed() -> None:
        pass

    admin = AdminApi(
        name="cp1",
        token_sha256=hashlib.sha256(b"t").hexdigest(),
        store=store,
        fleet=fleet,
        reconciler=Reconciler(store, fleet),
        blobs=BlobStore(tmp_path / "mirror"),
        on_keys_changed=keys_changed,
    )
    described = admin.app().openapi()
    await store.close()
    return described


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def is_typed(document: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether a schema says something: not empty, not an object of anything."""
    schema = resolve(document, schema)
    if schema.get("type") == "array":
        return is_typed(document, schema.get("items", {}))
    if schema.get("type") == "object" or not schema.get("type"):
        return bool(schema.get("properties") or schema.get("additionalProperties") or schema.get("anyOf"))
    return True


def api_operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, methods in document["paths"].items()
        if path.startswith("/api/")
        for method, operation in methods.items()
    ]


def test_every_route_of_the_admin_api_is_described(openapi: dict[str, Any]) -> None:
    described = {(path, method) for path, method, _ in api_operations(openapi)}
    assert {
        ("/api/status", "get"),
        ("/api/serving", "put"),
        ("/api/nodes", "get"),
        ("/api/replicas", "get"),
        ("/api/replicas/{replica_id}/logs", "get"),
        ("/api/models", "get"),
        ("/api/models", "post"),
        ("/api/models/{name}", "get"),
        ("/api/models/{name}", "delete"),
        ("/api/models/{name}/replicas", "put"),
        ("/api/keys", "get"),
        ("/api/keys", "post"),
        ("/api/keys/{key}", "delete"),
        ("/api/mirror/blobs", "get"),
        ("/api/mirror/blobs", "post"),
        ("/api/mirror/pulls", "get"),
        ("/api/mirror/pulls", "post"),
        ("/api/mirror/pulls/{pull_id}", "get"),
        ("/api/settings", "get"),
        ("/api/settings-history", "get"),
        ("/api/settings/{key}", "get"),
        ("/api/settings/{key}", "put"),
        ("/api/settings/{key}", "delete"),
        ("/api/agents/restart", "post"),
        ("/api/audit", "get"),
        ("/api/events", "get"),
        ("/api/plan", "get"),
        ("/api/presets", "get"),
    } <= described
    assert not any("{rest}" in path for path, _ in described), "the catch-all 404 is not a route to describe"


def test_every_request_body_is_typed(openapi: dict[str, Any]) -> None:
    bodies = {
        (path, method): operation["requestBody"]
        for path, method, operation in api_operations(openapi)
        if "requestBody" in operation
    }
    assert set(bodies) >= {
        ("/api/serving", "put"),
        ("/api/models", "post"),
        ("/api/models/{name}/replicas", "put"),
        ("/api/keys", "post"),
        ("/api/mirror/blobs", "post"),
        ("/api/mirror/pulls", "post"),
        ("/api/settings/{key}", "put"),
        ("/api/agents/restart", "post"),
    }
    for at, body in bodies.items():
        schemas = [content["schema"] for content in body["content"].values()]
        assert schemas and all(is_typed(openapi, s) for s in schemas), at


def test_every_answer_is_typed_and_every_error_has_the_error_shape(openapi: dict[str, Any]) -> None:
    for path, method, operation in api_operations(openapi):
        responses = operation["responses"]
        success = [status for status in responses if status.startswith("2")]
        assert success, (path, method)
        for status in success:
            if status == "204":
                assert "content" not in responses[status], (path, method)
                continue
            content = responses[status]["content"]
            if path == "/api/events":  # server-sent events: a stream of text
                assert list(content) == ["text/event-stream"], content
                continue
            schema = content["application/json"]["schema"]
            assert is_typed(openapi, schema), (path, method, status)
        assert "401" in responses, (path, method)
        assert "422" not in responses, "invalid requests are answered 400 in the error shape"
        for status in ERROR_STATUSES & set(responses):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, method, status)


def test_the_error_shape_names_message_hint_and_problems(openapi: dict[str, Any]) -> None:
    detail = resolve(openapi, openapi["components"]["schemas"]["ErrorBody"]["properties"]["error"])
    assert {"message", "hint", "problems"} <= set(detail["properties"])
    assert detail["required"] == ["message"]
