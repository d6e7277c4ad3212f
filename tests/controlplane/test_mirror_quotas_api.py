"""/api/mirror: uploads are their user's, bounded by a quota and a largest upload, refused with unsafe
names; a blob's uploader or a cluster admin removes it while nothing names it — over ASGI with a real
SQLite store and users' tokens."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.config import MirrorSettings
from llmgw.controlplane.lifecycle.leadership import Identity
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.errors import NotFound
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store
from llmgw.store.leases import ControlPlaneRecord

TOKEN = "llmgw-admin-test"
SETTINGS = MirrorSettings(quota_bytes=10, quotas={"bea": 100}, max_upload_bytes=50, ack_wait_s=0)


class Planes:
    def __init__(self) -> None:
        self.me = Identity("cp1", "10.0.0.1:8443", "http://10.0.0.1:8080")
        self.holder = "cp1"
        self.control_planes = [ControlPlaneRecord("cp1", "10.0.0.1:8443", "http://10.0.0.1:8080", 0.0)]


async def nowhere(address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
    raise NotFound(f"{address} is not reached in this test", "none")
    yield b""  # pragma: no cover - makes this a generator


@dataclass
class Mirror:
    app: Admission
    store: Store
    blobs: BlobStore
    replicator: MirrorReplicator
    admin: httpx.AsyncClient = field(init=False)

    def as_user(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
            base_url="http://cp",
            headers={"Authorization": f"Bearer {token}"},
        )

    async def member(self, name: str) -> httpx.AsyncClient:
        assert (await self.admin.post("/api/users", json={"name": name})).status_code == 201
        role = {"role": "member", "scope": "team:acme/ml"}
        assert (await self.admin.put(f"/api/users/{name}/roles", json=role)).status_code == 200
        created = await self.admin.post(f"/api/users/{name}/tokens", json={"name": "test"})
        return self.as_user(created.json()["token"])


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[Mirror]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    sha = hashlib.sha256(TOKEN.encode()).hexdigest()
    callers = Callers(sha)
    blobs = BlobStore(tmp_path / "mirror")
    replicator = MirrorReplicator(store, blobs, Planes(), nowhere, SETTINGS, live_s=30)

    async def keys_changed() -> None:
        return None

    admin = AdminApi(
        name="cp1",
        token_sha256=sha,
        store=store,
        fleet=fleet,
        reconciler=Reconciler(store, fleet),
        blobs=blobs,
        on_keys_changed=keys_changed,
        callers=callers,
        replicator=replicator,
        mirror=SETTINGS,
    )
    tree = Mirror(Admission(admin.app(), callers, 8 << 20), store, blobs, replicator)
    tree.admin = tree.as_user(TOKEN)
    async with tree.admin:
        assert (await tree.admin.post("/api/orgs", json={"name": "acme"})).status_code == 201
        assert (await tree.admin.post("/api/teams", json={"org": "acme", "name": "ml"})).status_code == 201
        yield tree
    await store.close()


async def upload(client: httpx.AsyncClient, data: bytes, filename: str = "m.gguf") -> httpx.Response:
    return await client.post("/api/mirror/blobs", params={"filename": filename}, content=data)


async def streamed(data: bytes, consumed: list[bytes]) -> AsyncIterator[bytes]:
    for index in range(0, len(data), 4):
        consumed.append(data[index : index + 4])
        yield data[index : index + 4]


def partials(mirror: Mirror) -> list[Path]:
    return list((mirror.blobs.root / "tmp").glob("*")) if (mirror.blobs.root / "tmp").is_dir() else []


async def test_an_upload_is_its_users_and_the_quota_shows_its_use(mirror: Mirror) -> None:
    async with await mirror.member("mia") as mia:
        assert (await upload(mia, b"GGUF1")).status_code == 201
        quota = (await mia.get("/api/mirror/quota")).json()
    assert quota == {"user": "mia", "used_bytes": 5, "quota_bytes": 10, "max_upload_bytes": 50}
    (listed,) = (await mirror.admin.get("/api/mirror/blobs")).json()
    assert listed["owner"] == "mia"


async def test_an_upload_past_the_quota_is_refused_before_its_bytes_are_read(mirror: Mirror) -> None:
    consumed: list[bytes] = []
    async with await mirror.member("mia") as mia:
        assert (await upload(mia, b"GGUF1")).status_code == 201
        answer = await mia.post(
            "/api/mirror/blobs",
            params={"filename": "n.gguf"},
            content=streamed(b"GGUF-six", consumed),
            headers={"Content-Length": "8"},
        )
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert "mia holds 5 bytes" in error["message"] and "quota of 10 bytes" in error["message"]
    assert "llmgw ctl mirror rm" in error["hint"]
    assert consumed == []
    assert len((await mirror.admin.get("/api/mirror/blobs")).json()) == 1


async def test_a_body_without_a_length_is_cut_where_it_passes_the_quota(mirror: Mirror) -> None:
    async with await mirror.member("mia") as mia:
        answer = await mia.post(
            "/api/mirror/blobs", params={"filename": "n.gguf"}, content=streamed(b"0123456789ab", [])
        )
    assert answer.status_code == 413
    assert "quota of 10 bytes" in answer.json()["error"]["message"]
    assert (await mirror.admin.get("/api/mirror/blobs")).json() == []
    assert partials(mirror) == []


async def test_a_users_own_quota_replaces_the_default(mirror: Mirror) -> None:
    async with await mirror.member("bea") as bea:
        assert (await upload(bea, b"x" * 40)).status_code == 201
        assert (await bea.get("/api/mirror/quota")).json()["quota_bytes"] == 100


async def test_a_cluster_admin_has_no_quota_but_the_largest_upload_bounds_every_upload(
    mirror: Mirror,
) -> None:
    assert (await upload(mirror.admin, b"y" * 40)).status_code == 201
    assert (await mirror.admin.get("/api/mirror/quota")).json()["quota_bytes"] is None
    answer = await upload(mirror.admin, b"z" * 51)
    assert answer.status_code == 413
    assert "mirror.max_upload_bytes" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("filename", "said"),
    [
        ("../etc/passwd", "'/'"),
        ("..", "'..'"),
        ("dir\\model.gguf", "'\\\\'"),
        ("model\x00.gguf", "\\x00"),
        ("model\n.gguf", "\\x0a"),
        ("\x1b[2Jm.gguf", "\\x1b"),
        ("m" * 256, "at most 255"),
    ],
)
async def test_an_unsafe_file_name_is_refused_saying_what_is_wrong(
    mirror: Mirror, filename: str, said: str
) -> None:
    answer = await upload(mirror.admin, b"GGUF", filename)
    assert answer.status_code == 400
    assert said in answer.json()["error"]["message"]
    assert (await mirror.admin.get("/api/mirror/blobs")).json() == []


async def test_its_uploader_removes_a_blob_and_the_replicator_removes_the_copy(mirror: Mirror) -> None:
    async with await mirror.member("mia") as mia:
        sha = (await upload(mia, b"GGUF1")).json()["sha256"]
        assert mirror.blobs.has(sha)
        answer = await mia.delete(f"/api/mirror/blobs/sha256:{sha}")
        assert answer.status_code == 200, answer.text
        assert (await mia.get("/api/mirror/quota")).json()["used_bytes"] == 0
    assert (answer.json()["sha256"], answer.json()["owner"]) == (sha, "mia")
    assert (await mirror.admin.get("/api/mirror/blobs")).json() == []
    await mirror.replicator.sync()
    assert not mirror.blobs.has(sha)
    assert await mirror.store.blob_copies.of(sha) == []
    entries = [e for e in await mirror.store.audit.list() if e.action == "mirror.remove"]
    assert [(e.actor, e.target, e.detail["filename"]) for e in entries] == [("mia", sha, "m.gguf")]


async def test_another_member_may_not_remove_a_blob_but_a_cluster_admin_may(mirror: Mirror) -> None:
    async with await mirror.member("mia") as mia:
        sha = (await upload(mia, b"GGUF1")).json()["sha256"]
    async with await mirror.member("max") as other:
        refused = await other.delete(f"/api/mirror/blobs/{sha}")
    assert refused.status_code == 403
    assert "it is mia's" in refused.json()["error"]["message"]
    assert (await mirror.admin.delete(f"/api/mirror/blobs/{sha}")).status_code == 200


async def test_a_blob_a_model_names_is_not_removed_and_the_refusal_names_the_model(mirror: Mirror) -> None:
    sha = (await upload(mirror.admin, b"GGUF1")).json()["sha256"]
    adapter = (await upload(mirror.admin, b"LORA1", "a.gguf")).json()["sha256"]
    definition = {
        "name": "chat",
        "source": {"sha256": sha},
        "adapters": [{"name": "chat-tuned", "sha256": adapter}],
    }
    assert (await mirror.admin.post("/api/models", json=definition)).status_code == 201
    for digest in (sha, adapter):
        answer = await mirror.admin.delete(f"/api/mirror/blobs/{digest}")
        assert answer.status_code == 409
        assert "in use by model chat" in answer.json()["error"]["message"]
    assert len((await mirror.admin.get("/api/mirror/blobs")).json()) == 2


async def test_a_blob_a_client_file_names_is_not_removed(mirror: Mirror) -> None:
    sha = (await upload(mirror.admin, b"GGUF1")).json()["sha256"]
    await mirror.store.files.add(
        owner="project:acme/ml/chat",
        key_id="k",
        purpose="user_data",
        filename="f.txt",
        size=5,
        sha256=sha,
        expires_s=None,
    )
    answer = await mirror.admin.delete(f"/api/mirror/blobs/{sha}")
    assert answer.status_code == 409
    assert "in use by file file-" in answer.json()["error"]["message"]


async def test_removing_a_blob_the_mirror_lacks_is_not_found(mirror: Mirror) -> None:
    answer = await mirror.admin.delete(f"/api/mirror/blobs/{'a' * 64}")
    assert answer.status_code == 404
    assert (await mirror.admin.delete("/api/mirror/blobs/not-a-digest")).status_code == 400


async def test_a_pull_does_not_start_once_the_callers_quota_is_used_up(mirror: Mirror) -> None:
    async with await mirror.member("mia") as mia:
        assert (await upload(mia, b"0123456789")).status_code == 201
        answer = await mia.post("/api/mirror/pulls", json={"source": "hf:org/repo"})
    assert answer.status_code == 413
    assert "mia holds 10 bytes" in answer.json()["error"]["message"]


def test_a_negative_quota_is_refused_naming_the_user() -> None:
    with pytest.raises(ValidationError, match="mia has less"):
        MirrorSettings(quotas={"mia": -1, "bea": 5})
    assert MirrorSettings(quotas={"bea": 5}).quota_of("bea") == 5
    assert MirrorSettings(quota_bytes=7).quota_of("mia") == 7
