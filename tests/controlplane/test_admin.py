"""The admin API: token, catalog validation, keys, mirror uploads — over ASGI with a real SQLite store."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.adminapi.schemas import StatusView
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.health import ComponentHealth, ComponentState
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-test"
COMPONENTS = [
    ComponentHealth("reconciler", ComponentState.RUNNING),
    ComponentHealth("load-reader", ComponentState.RESTARTING, 3, "OSError: refused", 1_700_000_000.5),
]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, list[int]]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    reloads: list[int] = []

    async def keys_changed() -> None:
        reloads.append(len(await store.keys.active()))

    admin = admin_api(
        store, tmp_path, token=TOKEN, fleet=fleet, on_keys_changed=keys_changed, components=lambda: COMPONENTS
    )
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield client, reloads
    await store.close()


async def upload(client: httpx.AsyncClient, data: bytes = b"GGUF weights") -> str:
    answer = await client.post("/api/mirror/blobs", params={"filename": "m.gguf"}, content=data)
    assert answer.status_code == 201
    return str(answer.json()["sha256"])


async def test_wrong_admin_token_gets_401_with_what_to_do(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.get("/api/status", headers={"Authorization": "Bearer nope"})
    assert answer.status_code == 401
    assert "admin.token" in answer.json()["error"]["hint"]


async def test_upload_is_kept_by_its_sha256(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client, b"abc")
    assert sha == hashlib.sha256(b"abc").hexdigest()
    assert [b["sha256"] for b in (await client.get("/api/mirror/blobs")).json()] == [sha]


async def test_model_is_added_with_its_weights_size(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client, b"x" * 1000)
    answer = await client.post("/api/models", json={"name": "m1", "source": {"sha256": sha}})
    assert answer.status_code == 201
    assert answer.json()["definition"]["source"]["size"] == 1000
    assert [m["name"] for m in (await client.get("/api/models")).json()] == ["m1"]


async def test_model_whose_weights_are_not_mirrored_is_refused(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.post("/api/models", json={"name": "m1", "source": {"sha256": "b" * 64}})
    assert answer.status_code == 400
    assert answer.json()["error"]["problems"][0]["field"] == "source.sha256"
    assert "mirror import" in answer.json()["error"]["hint"]


async def test_every_file_of_a_repository_must_be_mirrored_and_gets_its_size(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    weights, config = await upload(client, b"w" * 10), await upload(client, b"{}")
    source = {
        "sha256": weights,
        "filename": "model.safetensors",
        "format": "safetensors",
        "files": [
            {"sha256": config, "filename": "config.json"},
            {"sha256": "c" * 64, "filename": "tok.json"},
        ],
    }
    definition = {"name": "repo", "source": source, "profile": {"engine": "vllm"}}
    refused = await client.post("/api/models", json=definition)
    assert refused.status_code == 400
    assert [p["field"] for p in refused.json()["error"]["problems"]] == ["source.files.1.sha256"]
    assert "tok.json" in refused.json()["error"]["problems"][0]["problem"]
    source["files"] = source["files"][:1]  # type: ignore[index]
    added = await client.post("/api/models", json=definition)
    assert added.status_code == 201
    assert added.json()["definition"]["source"]["files"][0]["size"] == 2


async def test_malformed_definition_json_is_a_400(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.post("/api/models", content=b"{nope", headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert "not valid JSON" in answer.json()["error"]["message"]


async def test_unknown_field_is_named(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client)
    answer = await client.post("/api/models", json={"name": "m1", "source": {"sha256": sha}, "gpu": "big"})
    assert answer.status_code == 400
    assert {"field": "gpu", "problem": "unknown field; remove it or check its spelling"} in answer.json()[
        "error"
    ]["problems"]


async def test_second_model_of_one_name_is_a_409(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client)
    await client.post("/api/models", json={"name": "m1", "source": {"sha256": sha}})
    answer = await client.post("/api/models", json={"name": "m1", "source": {"sha256": sha}})
    assert answer.status_code == 409


async def test_removing_an_unknown_model_is_a_404(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    assert (await client.delete("/api/models/nope")).status_code == 404


async def test_key_secret_is_shown_once_and_the_ring_reloads(api) -> None:  # type: ignore[no-untyped-def]
    client, reloads = api
    created = (await client.post("/api/keys", json={"name": "app"})).json()
    assert created["key"].startswith("sk-llmgw-")
    listed = (await client.get("/api/keys")).json()
    assert "key" not in listed[0] and created["key"] not in str(listed)
    assert (await client.delete(f"/api/keys/{created['id']}")).status_code == 204
    assert reloads == [1, 0]


async def test_a_key_keeps_its_default_collections(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    created = await client.post("/api/keys", json={"name": "kb", "collections": ["handbook", "runbook"]})
    assert created.status_code == 201
    [listed] = [k for k in (await client.get("/api/keys")).json() if k["name"] == "kb"]
    assert listed["collections"] == ["handbook", "runbook"]
    for bad in ([""], "handbook", [f"c{i}" for i in range(9)]):
        answer = await client.post("/api/keys", json={"name": "kb2", "collections": bad})
        assert answer.status_code == 400
        assert answer.json()["error"]["problems"][0]["field"].startswith("collections")


async def test_key_request_with_unknown_field_is_a_400(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.post("/api/keys", json={"name": "app", "scope": "all"})
    assert answer.status_code == 400
    assert answer.json()["error"]["problems"][0]["field"] == "scope"


async def test_unknown_admin_route_is_a_404_naming_the_docs(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.get("/api/nothing")
    assert answer.status_code == 404 and "/api/docs" in answer.json()["error"]["hint"]


async def test_status_shows_each_supervised_component_with_its_last_error(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.get("/api/status")
    assert answer.status_code == 200
    assert answer.json()["components"][1] == {
        "name": "load-reader",
        "state": "restarting",
        "restarts": 3,
        "last_error": "OSError: refused",
        "last_error_at": 1_700_000_000.5,
    }
    status = StatusView.model_validate(answer.json())
    assert [c.state for c in status.components] == [ComponentState.RUNNING, ComponentState.RESTARTING]


async def test_status_without_components_given_lists_none(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    admin = admin_api(store, tmp_path, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=admin.app()),
        base_url="http://cp",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        answer = await client.get("/api/status")
    await store.close()
    assert answer.json()["components"] == []


async def test_an_invalid_query_parameter_is_a_400_in_the_error_shape(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.get("/api/audit", params={"limit": "many"})
    assert answer.status_code == 400
    assert answer.json()["error"]["problems"][0]["field"] == "query.limit"


async def test_a_model_definition_that_is_not_an_object_is_a_400(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.post("/api/models", json=["m1"])
    assert answer.status_code == 400
    assert answer.json()["error"]["problems"] == [{"field": "", "problem": "must be a JSON object"}]


async def test_models_list_their_typed_definition_and_keys_their_times(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client)
    await client.post("/api/models", json={"name": "m1", "source": {"sha256": sha}})
    await client.post("/api/keys", json={"name": "app"})
    listed = (await client.get("/api/models")).json()[0]
    assert [p["engine"] for p in listed["definition"]["profiles"]] == [
        "llama.cpp"
    ]  # one profile: a list of one
    assert (listed["replicas"], listed["ready"], listed["problem"]) == (0, 0, "")
    key = (await client.get("/api/keys")).json()[0]
    assert key["created_at"].startswith("20") and key["revoked_at"] is None


async def test_a_refused_profile_is_named_as_the_definition_names_it(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    one = {"engine": "vllm", "args": ["--trust-remote-code"]}
    source = {"sha256": "a" * 64, "format": "safetensors"}
    for given, field in (({"profile": one}, "profile.args"), ({"profiles": [{}, one]}, "profiles.1.args")):
        answer = await client.post("/api/models", json={"name": "bad", "source": source, **given})
        assert answer.status_code == 400
        assert [p["field"] for p in answer.json()["error"]["problems"]] == [field]


async def test_a_model_is_scaled_in_place_and_the_change_is_audited(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client)
    await client.post(
        "/api/models", json={"name": "team/m1", "source": {"sha256": sha}, "replicas": {"max": 3}}
    )
    answer = await client.put("/api/models/team/m1/replicas", json={"min": 2, "max": 4, "drain_timeout_s": 5})
    assert answer.status_code == 200, answer.text
    assert answer.json()["definition"]["replicas"]["max"] == 4
    stored = (await client.get("/api/models/team/m1")).json()["definition"]
    assert (stored["replicas"]["min"], stored["replicas"]["max"], stored["replicas"]["drain_timeout_s"]) == (
        2,
        4,
        5,
    )
    assert stored["source"]["sha256"] == sha, "the rest of the definition is kept"
    (entry,) = [e for e in (await client.get("/api/audit")).json() if e["action"] == "model.scale"]
    assert entry["target"] == "team/m1"
    assert (entry["detail"]["before"]["max"], entry["detail"]["after"]["max"]) == (3, 4)


async def test_scaling_with_min_above_max_or_an_unknown_field_is_a_400_naming_it(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    sha = await upload(client)
    await client.post("/api/models", json={"name": "m1", "source": {"sha256": sha}})
    answer = await client.put("/api/models/m1/replicas", json={"min": 3, "max": 2})
    assert answer.status_code == 400
    assert "min (3) is larger than max (2)" in answer.json()["error"]["message"]
    answer = await client.put("/api/models/m1/replicas", json={"max": 2, "colour": "blue"})
    assert answer.status_code == 400
    assert [p["field"] for p in answer.json()["error"]["problems"]] == ["colour"]
    assert (await client.get("/api/models/m1")).json()["definition"]["replicas"]["max"] == 1


async def test_scaling_an_unknown_model_is_a_404(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    answer = await client.put("/api/models/nope/replicas", json={"max": 2})
    assert answer.status_code == 404
    assert "ctl models" in answer.json()["error"]["hint"]
