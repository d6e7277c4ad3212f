"""``/api/models`` takes a provider model's key and never shows it again: not read back, not audited."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.gateway.provider_calls import ProviderHealth
from llmgw.store.database import Store
from llmgw.store.secretbox import SecretBox
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-test"
SECRET = "sk-provider-never-shown"
HEALTH = {
    "hosted": ProviderHealth(requests=3, last_status=429, last_error="429 at 12:00:00 UTC: rate limited")
}
MODEL = {
    "name": "hosted",
    "provider": {"base_url": "https://api.example.com/v1", "model": "gpt-4o", "key": SECRET},
}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await Store.open(
        f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}", secrets=SecretBox(SecretBox.new_key())
    )
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    admin = admin_api(store, tmp_path, token=TOKEN, fleet=fleet)
    admin.state.provider_health = lambda: HEALTH
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as http:
        yield http
    await store.close()


async def test_a_provider_model_is_added_without_weights_and_shows_its_key_as_set(
    client: httpx.AsyncClient,
) -> None:
    added = await client.post("/api/models", json=MODEL)
    assert added.status_code == 201, added.text
    assert added.json()["definition"]["provider"]["key"] == "set"
    shown = await client.get("/api/models/hosted")
    assert shown.json()["definition"]["provider"] == {**MODEL["provider"], "key": "set"} | {
        "api": "openai",
        "max_concurrency": 16,
        "timeouts": {"connect_s": 5.0, "first_byte_s": 60.0, "total_s": 600.0},
    }
    listed = await client.get("/api/models")
    assert [m["definition"]["provider"]["key"] for m in listed.json()] == ["set"]
    assert SECRET not in added.text + shown.text + listed.text


async def test_the_audit_log_says_the_key_is_set_and_never_holds_it(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/models", json=MODEL)).status_code == 201
    audit = await client.get("/api/audit")
    [entry] = [e for e in audit.json() if e["action"] == "model.add"]
    assert entry["detail"]["provider"]["key"] == "set"
    assert SECRET not in audit.text


async def test_a_provider_model_with_weights_is_a_400_naming_what_to_remove(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.post("/api/models", json={**MODEL, "replicas": {"min": 2, "max": 2}})
    assert answer.status_code == 400
    assert "remove replicas" in answer.text
    assert SECRET not in answer.text


async def test_a_provider_model_is_a_fallback_target(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/models", json=MODEL)).status_code == 201
    blob = await client.post("/api/mirror/blobs", params={"filename": "m.gguf"}, content=b"GGUF weights")
    sha = blob.json()["sha256"]
    falling = {"name": "local", "source": {"sha256": sha}, "fallbacks": ["hosted"]}
    assert (await client.post("/api/models", json=falling)).status_code == 201


async def test_status_and_the_listing_show_each_provider_and_its_last_error(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.post("/api/models", json=MODEL)).status_code == 201
    status = (await client.get("/api/status")).json()
    assert status["providers"] == {
        "hosted": {
            "served_by": "openai gpt-4o at api.example.com",
            "requests": 3,
            "last_error": "429 at 12:00:00 UTC: rate limited",
        }
    }
    [listed] = (await client.get("/api/models")).json()
    assert listed["provider_error"] == "429 at 12:00:00 UTC: rate limited"


async def test_the_plan_says_a_provider_model_has_nothing_to_place(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/models", json=MODEL)).status_code == 201
    [planned] = (await client.get("/api/plan")).json()
    assert planned["node"] == "" and planned["wanted"] == 0
    assert (
        planned["problem"]
        == "served outside the cluster (openai gpt-4o at api.example.com): nothing to place"
    )
