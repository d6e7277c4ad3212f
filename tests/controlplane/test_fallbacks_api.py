"""``/api/models`` checks a model's fallbacks against the catalog, and keeps a fallback while it is one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-test"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    admin = admin_api(store, tmp_path, token=TOKEN, fleet=fleet)
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as http:
        yield http
    await store.close()


@pytest.fixture
async def sha(client: httpx.AsyncClient) -> str:
    answer = await client.post("/api/mirror/blobs", params={"filename": "m.gguf"}, content=b"GGUF weights")
    assert answer.status_code == 201
    return str(answer.json()["sha256"])


async def test_a_model_falling_to_catalog_models_is_added(client: httpx.AsyncClient, sha: str) -> None:
    assert (
        await client.post("/api/models", json={"name": "small", "source": {"sha256": sha}})
    ).status_code == 201
    definition = {"name": "big", "source": {"sha256": sha}, "fallbacks": ["small"], "fallback_ttft_ms": 900}
    added = await client.post("/api/models", json=definition)
    assert added.status_code == 201
    assert added.json()["definition"]["fallbacks"] == ["small"]
    assert added.json()["definition"]["fallback_ttft_ms"] == 900


async def test_a_fallback_not_in_the_catalog_is_a_400_naming_it(client: httpx.AsyncClient, sha: str) -> None:
    answer = await client.post(
        "/api/models", json={"name": "big", "source": {"sha256": sha}, "fallbacks": ["small"]}
    )
    assert answer.status_code == 400
    [problem] = answer.json()["error"]["problems"]
    assert problem["field"] == "fallbacks.0"
    assert "no model 'small' in the catalog" in problem["problem"]
    assert (await client.get("/api/models")).json() == []


async def test_a_fallback_serving_other_routes_is_a_400(client: httpx.AsyncClient, sha: str) -> None:
    embed = {"name": "embed", "source": {"sha256": sha}, "profile": {"serves": "embeddings"}}
    assert (await client.post("/api/models", json=embed)).status_code == 201
    answer = await client.post(
        "/api/models", json={"name": "chat", "source": {"sha256": sha}, "fallbacks": ["embed"]}
    )
    assert answer.status_code == 400
    assert "serves embeddings" in answer.json()["error"]["problems"][0]["problem"]


async def test_a_model_others_fall_to_cannot_be_removed_until_they_go(
    client: httpx.AsyncClient, sha: str
) -> None:
    await client.post("/api/models", json={"name": "small", "source": {"sha256": sha}})
    await client.post("/api/models", json={"name": "big", "source": {"sha256": sha}, "fallbacks": ["small"]})
    refused = await client.delete("/api/models/small")
    assert refused.status_code == 409
    assert "fallback of big" in refused.json()["error"]["message"]
    assert (await client.delete("/api/models/big")).status_code == 204
    assert (await client.delete("/api/models/small")).status_code == 204
