"""/api/knowledge: collections owned like models, documents uploaded and searched, pairs, refusals.

A real admin app on a real SQLite store; the embedder is the hashed stand-in
(the real model through the gateway is tests/e2e/test_knowledge_llamacpp.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.callers import Callers
from llmgw.knowledge.embedding import SERVICE_KEY_NAME, service_secret
from llmgw.knowledge.service import knowledge_with
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api
from llmgw.testing.clock import FakeClock
from llmgw.testing.hashed_embeddings import HashedEmbedder

TOKEN = "llmgw-admin-test"
SHA = hashlib.sha256(TOKEN.encode()).hexdigest()

GUIDE = b"""# Guide

## Cooling

The reactor is cooled by heavy water pumped through the core.

## Baking

Bread rises because yeast turns sugar into carbon dioxide.
"""


@dataclass
class Cluster:
    app: Admission
    store: Store
    embedder: HashedEmbedder
    keys_reloaded: list[bool] = field(default_factory=list)
    admin: httpx.AsyncClient = field(init=False)

    def as_user(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
            base_url="http://cp",
            headers={"Authorization": f"Bearer {token}"},
        )

    async def user(self, name: str, role: str, scope: str) -> httpx.AsyncClient:
        assert (await self.admin.post("/api/users", json={"name": name})).status_code == 201
        answer = await self.admin.put(f"/api/users/{name}/roles", json={"role": role, "scope": scope})
        assert answer.status_code == 200, answer.text
        created = await self.admin.post(f"/api/users/{name}/tokens", json={"name": "test"})
        return self.as_user(created.json()["token"])


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    clock = FakeClock()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}", clock=clock)
    callers = Callers(SHA, clock=clock)
    embedder = HashedEmbedder()
    reloaded: list[bool] = []

    async def keys_changed() -> None:
        reloaded.append(True)

    admin = admin_api(store, tmp_path, token=TOKEN, callers=callers, on_keys_changed=keys_changed)
    admin.state.knowledge = knowledge_with(store, embedder, service_secret(SHA))
    tree = Cluster(Admission(admin.app(), callers, 8 << 20), store, embedder, reloaded)
    tree.admin = tree.as_user(TOKEN)
    async with tree.admin:
        for path, body in (
            ("/api/orgs", {"name": "acme"}),
            ("/api/teams", {"org": "acme", "name": "ml"}),
            ("/api/teams", {"org": "acme", "name": "web"}),
        ):
            assert (await tree.admin.post(path, json=body)).status_code == 201
        sha = (
            await tree.admin.post("/api/mirror/blobs", params={"filename": "e.gguf"}, content=b"GGUF")
        ).json()
        embeds = {"serves": "embeddings", "pooling": "mean"}
        model = {"name": "minilm", "source": {"sha256": sha["sha256"]}, "profile": embeds}
        assert (await tree.admin.post("/api/models", json=model)).status_code == 201, "embedding model"
        chat = {"name": "chat", "source": {"sha256": sha["sha256"]}}
        assert (await tree.admin.post("/api/models", json=chat)).status_code == 201
        yield tree
    await store.close()


async def _create(client: httpx.AsyncClient, name: str, owner: str = "team:acme/ml") -> httpx.Response:
    return await client.post(
        "/api/knowledge/collections", json={"name": name, "owner": owner, "embedding_model": "minilm"}
    )


async def test_a_member_creates_uploads_lists_searches_and_deletes(cluster: Cluster) -> None:
    async with await cluster.user("mia", "member", "team:acme/ml") as mia:
        assert (await _create(mia, "guide")).status_code == 201
        up = await mia.put("/api/knowledge/collections/guide/documents/guide.md", content=GUIDE)
        assert up.status_code == 201, up.text
        assert (up.json()["kind"], up.json()["passages"]) == ("markdown", 3)
        listed = (await mia.get("/api/knowledge/collections")).json()
        assert [(c["name"], c["documents"], c["passages"]) for c in listed] == [("guide", 1, 3)]
        for mode in ("hybrid", "vector", "keyword"):
            found = await mia.post(
                "/api/knowledge/search",
                json={
                    "collections": ["guide"],
                    "query": "why does bread rise with yeast",
                    "mode": mode,
                    "limit": 2,
                },
            )
            assert found.status_code == 200, found.text
            assert "yeast" in found.json()[0]["text"], mode
            assert found.json()[0]["document"] == "guide.md"
        assert (await mia.delete("/api/knowledge/collections/guide")).status_code == 204
        assert (await mia.get("/api/knowledge/collections/guide")).status_code == 404


async def test_another_teams_collection_is_404_as_if_it_did_not_exist(cluster: Cluster) -> None:
    assert (await _create(cluster.admin, "web-docs", "team:acme/web")).status_code == 201
    async with await cluster.user("mia", "member", "team:acme/ml") as mia:
        assert (await mia.get("/api/knowledge/collections")).json() == []
        for answer in (
            await mia.get("/api/knowledge/collections/web-docs"),
            await mia.put("/api/knowledge/collections/web-docs/documents/a.txt", content=b"hello"),
            await mia.post("/api/knowledge/search", json={"collections": ["web-docs"], "query": "hello"}),
        ):
            assert answer.status_code == 404
            assert answer.json()["error"]["message"] == "collection 'web-docs' does not exist"


async def test_a_viewer_may_search_but_not_create_nor_upload(cluster: Cluster) -> None:
    assert (await _create(cluster.admin, "guide")).status_code == 201
    async with await cluster.user("vera", "viewer", "team:acme/ml") as vera:
        refused = await _create(vera, "mine")
        assert refused.status_code == 403 and "needs member" in refused.json()["error"]["message"]
        upload = await vera.put("/api/knowledge/collections/guide/documents/a.txt", content=b"hello")
        assert upload.status_code == 403
        assert (
            await vera.post("/api/knowledge/search", json={"collections": ["guide"], "query": "x"})
        ).json() == []


async def test_a_file_of_another_kind_or_a_broken_pdf_is_a_400_naming_it(cluster: Cluster) -> None:
    assert (await _create(cluster.admin, "guide")).status_code == 201
    docx = await cluster.admin.put("/api/knowledge/collections/guide/documents/notes.docx", content=b"PK")
    assert docx.status_code == 400 and "'notes.docx'" in docx.json()["error"]["message"]
    assert ".pdf" in docx.json()["error"]["hint"]
    pdf = await cluster.admin.put(
        "/api/knowledge/collections/guide/documents/bad.pdf", content=b"%PDF-1.4 nonsense"
    )
    assert pdf.status_code == 400 and "'bad.pdf'" in pdf.json()["error"]["message"]
    assert cluster.embedder.calls == []  # refused before anything was embedded


@pytest.mark.parametrize(
    ("name", "said"), [("notes%00.txt", "\\x00"), ("notes%1B%5B2J.txt", "\\x1b"), ("%2E%2E", "'..'")]
)
async def test_a_document_name_with_a_control_character_is_a_400_naming_it(
    cluster: Cluster, name: str, said: str
) -> None:
    assert (await _create(cluster.admin, "guide")).status_code == 201
    answer = await cluster.admin.put(f"/api/knowledge/collections/guide/documents/{name}", content=b"hello")
    assert answer.status_code == 400
    assert said in answer.json()["error"]["message"]
    assert "\x00" not in answer.text and "\x1b" not in answer.text
    assert cluster.embedder.calls == []


async def test_the_embedding_model_must_serve_embeddings_and_exist(cluster: Cluster) -> None:
    chat = await cluster.admin.post(
        "/api/knowledge/collections", json={"name": "c", "embedding_model": "chat"}
    )
    assert chat.status_code == 400 and "serves chat" in chat.json()["error"]["message"]
    none = await cluster.admin.post("/api/knowledge/collections", json={"name": "c"})
    assert none.status_code == 400 and "knowledge.embedding_model" in none.json()["error"]["hint"]
    assert "llmgw up (make up) serves no embedding model" in none.json()["error"]["hint"]
    await cluster.admin.put("/api/settings/knowledge.embedding_model", json={"value": "minilm"})
    made = await cluster.admin.post("/api/knowledge/collections", json={"name": "c"})
    assert made.status_code == 201 and made.json()["embedding_model"] == "minilm"


async def test_creating_a_collection_writes_the_control_planes_own_key_once(cluster: Cluster) -> None:
    assert (await _create(cluster.admin, "one")).status_code == 201
    assert (await _create(cluster.admin, "two")).status_code == 201
    keys = await cluster.store.keys.active()
    assert [k.name for k in keys] == [SERVICE_KEY_NAME]
    assert keys[0].secret_hash == hashlib.sha256(service_secret(SHA).encode()).hexdigest()
    assert cluster.keys_reloaded == [True]


async def test_an_upload_with_progress_answers_a_line_per_batch_and_the_document_last(
    cluster: Cluster,
) -> None:
    assert (await _create(cluster.admin, "guide")).status_code == 201
    text = "\n\n".join(f"# Part {i}\n\nWords of part {i} " + "filler " * 150 for i in range(40))
    answer = await cluster.admin.put(
        "/api/knowledge/collections/guide/documents/long.txt",
        content=text.encode(),
        params={"progress": "true"},
    )
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert lines[0] == {"embedded": 0, "of": 40}
    assert [line["embedded"] for line in lines[1:-1]] == [32, 40]
    assert lines[-1]["document"]["passages"] == 40


async def test_pairs_are_added_from_json_lines_and_a_bad_line_is_named(cluster: Cluster) -> None:
    assert (await _create(cluster.admin, "guide")).status_code == 201
    body = b'{"question": "q1", "answer": "a1"}\n{"question": "q2", "answer": "a2"}\n'
    added = await cluster.admin.post("/api/knowledge/collections/guide/pairs", content=body)
    assert added.status_code == 201 and added.json() == {"collection": "guide", "added": 2, "pairs": 2}
    bad = await cluster.admin.post("/api/knowledge/collections/guide/pairs", content=b'{"question": 1}\n')
    assert bad.status_code == 400 and "line 1" in bad.json()["error"]["message"]
