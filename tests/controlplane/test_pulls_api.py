"""``/api/mirror/pulls``: a pull started over the API runs on the control plane and shows its progress."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.testing.admin import TOKEN, admin_app
from llmgw.testing.eventually import eventually
from llmgw.testing.hf_hub_standin import FakeHfHub, small_repo

HF_TOKEN = "hf_gated_access_5678"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, FakeHfHub]]:
    gated = small_repo("gated")
    gated.gated_token = HF_TOKEN
    async with FakeHfHub({"org/gated": gated}) as hub, admin_app(tmp_path) as app:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as client:
            answer = await client.put("/api/settings/mirror.hf_endpoint", json={"value": hub.url})
            assert answer.status_code == 200, answer.text
            yield client, hub  # type: ignore[misc]


async def finished(client: httpx.AsyncClient, pull_id: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        view: dict[str, Any] = (await client.get(f"/api/mirror/pulls/{pull_id}")).json()
        return view if view["state"] != "running" else None

    found: dict[str, Any] = await eventually(ended, timeout_s=30, message=f"pull {pull_id} ends")
    return found


async def test_pull_with_a_token_ends_done_with_files_and_catalog_source_and_no_token_shown(api) -> None:  # type: ignore[no-untyped-def]
    client, _hub = api
    started = await client.post("/api/mirror/pulls", json={"source": "hf:org/gated", "hf_token": HF_TOKEN})
    assert started.status_code == 202
    assert HF_TOKEN not in started.text
    view = await finished(client, started.json()["id"])
    assert view["state"] == "done", view
    assert view["catalog_source"]["format"] == "safetensors"
    assert view["bytes_done"] == view["bytes_total"] > 0
    listing = await client.get("/api/mirror/pulls")
    assert [p["id"] for p in listing.json()] == [view["id"]]
    assert HF_TOKEN not in listing.text
    blobs = {b["sha256"]: b["owner"] for b in (await client.get("/api/mirror/blobs")).json()}
    assert {f["sha256"] for f in view["files"]} <= set(blobs)
    assert {blobs[f["sha256"]] for f in view["files"]} == {"admin"}, "a pull's files are its caller's"


async def test_pull_of_a_gated_repo_without_token_fails_with_what_to_do(api) -> None:  # type: ignore[no-untyped-def]
    client, _hub = api
    started = await client.post("/api/mirror/pulls", json={"source": "hf:org/gated"})
    view = await finished(client, started.json()["id"])
    assert view["state"] == "failed"
    assert "GatedRepo" in view["error"] and "--hf-token" in view["hint"]


async def test_source_of_no_registry_is_refused_with_the_forms_to_use(api) -> None:  # type: ignore[no-untyped-def]
    client, _hub = api
    answer = await client.post("/api/mirror/pulls", json={"source": "s3://bucket/model"})
    assert answer.status_code == 400
    assert "hf:ORG/REPO" in answer.json()["error"]["hint"]


async def test_unknown_pull_is_404(api) -> None:  # type: ignore[no-untyped-def]
    client, _hub = api
    assert (await client.get("/api/mirror/pulls/nope")).status_code == 404


async def test_hub_address_setting_takes_only_an_http_address(api) -> None:  # type: ignore[no-untyped-def]
    client, _hub = api
    answer = await client.put("/api/settings/mirror.hf_endpoint", json={"value": "huggingface.co"})
    assert answer.status_code == 400
    assert "http(s) address" in answer.text
