"""/api/mirror/blobs: an upload answers with its copies; the listing shows each blob's copies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.config import MirrorSettings
from llmgw.controlplane.lifecycle.leadership import Identity
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.errors import NotFound
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store
from llmgw.store.leases import ControlPlaneRecord
from llmgw.testing.admin import TOKEN, admin_api


class Planes:
    def __init__(self) -> None:
        self.me = Identity("cp1", "10.0.0.1:8443", "http://10.0.0.1:8080")
        self.holder = "cp1"
        self.control_planes = [
            ControlPlaneRecord("cp1", "10.0.0.1:8443", "http://10.0.0.1:8080", 0.0),
            ControlPlaneRecord("cp2", "10.0.0.2:8443", "http://10.0.0.2:8080", 3600.0),  # long gone
        ]


async def nowhere(address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
    raise NotFound(f"{address} is not reached in this test", "none")
    yield b""  # pragma: no cover - makes this a generator


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    replicator = MirrorReplicator(
        store, BlobStore(tmp_path / "mirror"), Planes(), nowhere, MirrorSettings(), live_s=30
    )
    admin = admin_api(store, tmp_path, replicator=replicator)
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as opened:
        yield opened
    await store.close()


async def test_an_upload_with_no_live_peer_answers_one_copy_of_two_and_the_listing_shows_it(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.post("/api/mirror/blobs", params={"filename": "m.gguf"}, content=b"GGUF")
    assert answer.status_code == 201
    body = answer.json()
    assert (body["copies"], body["wanted"]) == (["cp1"], 2)
    assert body["note"].startswith("acknowledged with 1 copy of 2 wanted: no other control plane is live yet")
    (listed,) = (await client.get("/api/mirror/blobs")).json()
    assert [(c["plane"], c["address"]) for c in listed["copies"]] == [("cp1", "10.0.0.1:8443")]
