"""``/api/upgrades/agents``: the leader checks the release, then the rollout is started and shown."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.lifecycle.upgrading import AgentUpgrades
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.releases import SIGNATURE, SUMS, write_release
from llmgw.pki.signing import generate_signing_key
from llmgw.store.database import Store
from llmgw.testing.admin import TOKEN, admin_api
from llmgw.testing.standin_builds import fake_llmgw_wheel


@dataclass
class Leader:
    rollouts: AgentUpgrades
    mirror: BlobStore


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Leader, Path]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    admin = admin_api(store, tmp_path)
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    wheel = fake_llmgw_wheel(tmp_path, "5.0.0")
    write_release(tmp_path / "rel", wheel, tmp_path / "release.key")
    upgrades = AgentUpgrades(admin.state.fleet, admin.state.blobs, tmp_path / "trusted.pub", store)
    admin.state.upgrades = upgrades
    leader = Leader(upgrades, admin.state.blobs)
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield client, leader, tmp_path / "rel"
    await store.close()


def body(release: Path, **changes: str) -> dict[str, str]:
    return {"sums": (release / SUMS).read_text(), "signature": (release / SIGNATURE).read_text(), **changes}


async def test_a_release_whose_files_are_not_in_the_mirror_is_refused(api) -> None:  # type: ignore[no-untyped-def]
    client, _, release = api
    answer = await client.post("/api/upgrades/agents", json=body(release))
    assert answer.status_code == 404 and "is not in the mirror" in answer.text


async def test_a_badly_signed_release_is_refused_with_the_reason(api) -> None:  # type: ignore[no-untyped-def]
    client, upgrades, release = api
    await upgrades.mirror.import_file(release / "llmgw-5.0.0-py3-none-any.whl")
    altered = body(release, sums=(release / SUMS).read_text() + "\n")  # one more byte than signed
    answer = await client.post("/api/upgrades/agents", json=altered)
    assert answer.status_code == 400 and "signature does not match" in answer.text


async def test_a_good_release_starts_a_rollout_shown_until_it_ends(api) -> None:  # type: ignore[no-untyped-def]
    client, upgrades, release = api
    assert (await client.get("/api/upgrades/agents")).status_code == 404
    await upgrades.mirror.import_file(release / "llmgw-5.0.0-py3-none-any.whl")
    answer = await client.post("/api/upgrades/agents", json=body(release))
    assert answer.status_code == 202 and answer.json()["version"] == "5.0.0"
    await upgrades.rollouts.wait()
    shown = (await client.get("/api/upgrades/agents")).json()
    assert shown == {
        "version": "5.0.0",
        "nodes": [],
        "upgraded": [],
        "current": "",
        "error": "",
        "finished": True,
    }
