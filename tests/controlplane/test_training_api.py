"""/api/training/jobs: submit (every bad input a 400 naming it), follow, cancel, and publish."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.replicas.adapterrolling import stale
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.catalog import parse_model
from llmgw.core.shards import ReplicaPhase
from llmgw.core.tenancy import Owner
from llmgw.core.training import JobState, pairs_bytes
from llmgw.errors import NotFound
from llmgw.knowledge.pairs import CollectionPairs
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store

from .trainingkit import add_model, mirror

TOKEN = "training-admin-token"
PAIRS = '{"question": "colour?", "answer": "blue"}\n'


class Collections:
    """Knowledge collections in memory: name -> (owner, pairs)."""

    def __init__(self, held: dict[str, tuple[Owner, list[tuple[str, str]]]]) -> None:
        self.held = held

    async def pairs(self, collection: str) -> tuple[Owner, list[tuple[str, str]]]:
        if collection not in self.held:
            raise NotFound(f"no knowledge collection {collection!r}")
        return self.held[collection]


class Api:
    def __init__(self, app: Admission, admin: AdminApi, store: Store) -> None:
        self.app, self.admin, self.store = app, admin, store
        self.client = self.as_token(TOKEN)

    def as_token(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
            base_url="http://cp",
            headers={"Authorization": f"Bearer {token}"},
        )

    async def user(self, name: str, role: str, scope: str) -> httpx.AsyncClient:
        assert (await self.client.post("/api/users", json={"name": name})).status_code == 201
        bound = await self.client.put(f"/api/users/{name}/roles", json={"role": role, "scope": scope})
        assert bound.status_code == 200, bound.text
        created = await self.client.post(f"/api/users/{name}/tokens", json={"name": "t"})
        return self.as_token(created.json()["token"])


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    sha = hashlib.sha256(TOKEN.encode()).hexdigest()
    callers = Callers(sha)

    async def keys_changed() -> None:
        return None

    admin = AdminApi(
        name="cp1",
        token_sha256=sha,
        store=store,
        fleet=fleet,
        reconciler=Reconciler(store, fleet),
        blobs=BlobStore(tmp_path / "mirror"),
        on_keys_changed=keys_changed,
        callers=callers,
    )
    api = Api(Admission(admin.app(), callers, 8 << 20), admin, store)
    async with api.client:
        for path, body in (
            ("/api/orgs", {"name": "acme"}),
            ("/api/teams", {"org": "acme", "name": "ml"}),
            ("/api/teams", {"org": "acme", "name": "web"}),
        ):
            assert (await api.client.post(path, json=body)).status_code == 201
        await add_model(store, admin.state.blobs)
        yield api
    await store.close()


def submit(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny-llama", "pairs": PAIRS, "memory_mb": 2048, "device": "cpu", **extra}


async def refused(client: httpx.AsyncClient, body: dict[str, Any], status: int = 400) -> dict[str, Any]:
    answer = await client.post("/api/training/jobs", json=body)
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["hint"]
    return error


async def test_bad_input_is_a_400_naming_it_never_a_5xx(api: Api) -> None:
    bad_lines = "\n".join(
        [PAIRS.strip(), "not json", '{"question": "q"}', "[1]", '{"question": "q", "answer": "a", "x": 1}']
    )
    error = await refused(api.client, submit(pairs=bad_lines))
    fields = [p["field"] for p in error["problems"]]
    assert fields == ["pairs.line 2", "pairs.line 3", "pairs.line 4", "pairs.line 5"]
    assert "answer is missing" in error["message"] and "unknown field 'x'" in error["message"]
    error = await refused(api.client, submit(options={"rank": 0, "steps": "many", "colour": 1}))
    assert {p["field"] for p in error["problems"]} == {"options.rank", "options.steps", "options.colour"}
    await refused(api.client, submit(pairs=""))
    await refused(api.client, submit(memory_mb=0))
    await refused(api.client, submit(device="tpu"))
    await refused(api.client, submit(weights=[{"sha256": "ab" * 32, "filename": "config.json"}]))
    error = await refused(
        api.client,
        submit(
            weights=[
                {"sha256": "ab" * 32, "filename": "model.safetensors"},
                {"sha256": "cd" * 32, "filename": "config.json"},
            ]
        ),
    )
    assert "in the mirror" in error["message"]
    error = await refused(api.client, submit(model="nope"), 404)
    assert "not in the catalog" in error["message"]
    assert (await api.client.get("/api/training/jobs/not-a-job")).status_code == 404


async def test_a_gguf_model_needs_its_safetensors_named_and_makes_a_gguf_adapter(api: Api) -> None:
    blobs = api.admin.state.blobs
    gguf = await mirror(api.store, blobs, b"GGUF base", "base.gguf")
    await api.store.models.add(
        "tiny-gguf", {"name": "tiny-gguf", "source": gguf, "profiles": [{"engine": "llama.cpp"}]}
    )
    error = await refused(api.client, submit(model="tiny-gguf"))
    assert "kept as GGUF" in error["message"] and "--weights" in error["hint"]
    tiny = parse_model((await api.store.models.get("tiny-llama")).definition).source
    named = [
        {"sha256": tiny.sha256, "filename": tiny.filename},
        *[{"sha256": f.sha256, "filename": f.filename} for f in tiny.files],
    ]
    answer = await api.client.post("/api/training/jobs", json=submit(model="tiny-gguf", weights=named))
    assert answer.status_code == 201, answer.text
    assert answer.json()["gguf"] is True
    plain = await api.client.post("/api/training/jobs", json=submit())
    assert plain.json()["gguf"] is False  # vLLM serves the PEFT folder


async def test_a_user_submits_follows_and_cancels_a_job_others_do_not_see(api: Api) -> None:
    async with await api.user("mia", "member", "team:acme/ml") as mia:
        answer = await mia.post("/api/training/jobs", json=submit(owner="team:acme/ml", options={"rank": 4}))
        assert answer.status_code == 201, answer.text
        job = answer.json()
        assert (job["state"], job["owner"], job["options"]["rank"], job["node"]) == (
            "queued",
            "team:acme/ml",
            4,
            "any",
        )
        assert [j["id"] for j in (await mia.get("/api/training/jobs")).json()] == [job["id"]]
        assert (await mia.get(f"/api/training/jobs/{job['id']}/logs")).json()["lines"] == []
        own = await mia.post("/api/training/jobs", json=submit())
        assert own.json()["owner"] == "user:mia"
        async with await api.user("wes", "member", "team:acme/web") as wes:
            assert (await wes.get(f"/api/training/jobs/{job['id']}")).status_code == 404
            assert (await wes.post(f"/api/training/jobs/{job['id']}/cancel")).status_code == 404
            assert (await wes.get("/api/training/jobs")).json() == []
            error = await refused(wes, submit(owner="team:acme/ml"), 403)
            assert "member" in error["message"]
        cancelled = await mia.post(f"/api/training/jobs/{job['id']}/cancel")
        assert cancelled.json()["state"] == "cancelled" and cancelled.json()["error"] == "cancelled by mia"
        again = await mia.post(f"/api/training/jobs/{job['id']}/cancel")
        assert again.status_code == 409


async def succeeded_job(
    api: Api, adapter_config: dict[str, Any], owner: str = "team:acme/ml", **extra: Any
) -> str:
    answer = await api.client.post(
        "/api/training/jobs", json=submit(owner=owner, options={"rank": 8}, **extra)
    )
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["id"]
    blobs = api.admin.state.blobs
    results = [
        await mirror(api.store, blobs, b"lora weights", "adapter_model.safetensors"),
        await mirror(api.store, blobs, json.dumps(adapter_config).encode(), "adapter_config.json"),
    ]
    await api.store.training.change(job_id, state=JobState.SUCCEEDED, results=results)
    return job_id


FITTING = {
    "peft_type": "LORA",
    "r": 8,
    "target_modules": ["q_proj", "v_proj"],
    "base_model_name_or_path": "/tmp/base",
}


async def test_publish_makes_the_adapter_of_the_model_owned_by_the_jobs_owner(api: Api) -> None:
    job_id = await succeeded_job(api, FITTING)
    answer = await api.client.post(f"/api/training/jobs/{job_id}/publish", json={"name": "tiny-blue"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["owner"] == "team:acme/ml"
    model = parse_model((await api.store.models.get("tiny-llama")).definition)
    (adapter,) = model.adapters
    assert (adapter.name, adapter.owner, adapter.rank, adapter.filename) == (
        "tiny-blue",
        "team:acme/ml",
        8,
        "adapter_model.safetensors",
    )
    assert [f.filename for f in adapter.files] == ["adapter_config.json"]
    clash = await api.client.post(f"/api/training/jobs/{job_id}/publish", json={"name": "tiny-blue"})
    assert clash.status_code == 409


async def test_publish_leaves_the_replicas_serving_for_the_reconciler_to_roll(api: Api) -> None:
    job_id = await succeeded_job(api, FITTING)
    fleet = api.admin.state.fleet
    fleet.track(ReplicaState("tiny-1", "tiny-llama", "n1", "key", state=ReplicaPhase.READY, adapters=()))
    answer = await api.client.post(f"/api/training/jobs/{job_id}/publish", json={"name": "tiny-blue"})
    assert answer.status_code == 200, answer.text
    replica = fleet.replicas["tiny-1"]
    assert replica.draining_since is None  # it serves the model until one with the adapter is ready
    model = parse_model((await api.store.models.get("tiny-llama")).definition)
    assert stale(model, [replica]) == [replica]  # tests/controlplane/test_adapter_rolling.py


async def test_publish_refuses_an_adapter_that_does_not_fit_naming_what_differs(api: Api) -> None:
    wrong = {**FITTING, "r": 16, "target_modules": ["c_attn"], "base_model_name_or_path": "gpt2"}
    job_id = await succeeded_job(api, wrong)
    error = (await api.client.post(f"/api/training/jobs/{job_id}/publish", json={"name": "x"})).json()[
        "error"
    ]
    fields = {p["field"]: p["problem"] for p in error["problems"]}
    assert "the job trained rank 8" in fields["adapter_config.json.r"]
    assert "c_attn not in a llama model" in fields["adapter_config.json.target_modules"]
    assert "'gpt2', not the model 'tiny-llama'" in fields["adapter_config.json.base_model_name_or_path"]
    assert parse_model((await api.store.models.get("tiny-llama")).definition).adapters == ()


async def test_only_a_succeeded_job_is_published(api: Api) -> None:
    answer = await api.client.post("/api/training/jobs", json=submit())
    published = await api.client.post(f"/api/training/jobs/{answer.json()['id']}/publish", json={"name": "x"})
    assert published.status_code == 409 and "is queued" in published.json()["error"]["message"]


async def test_pairs_from_collections_need_an_implementation(api: Api) -> None:
    error = await refused(api.client, submit(pairs="", pairs_from=["faq"]))
    assert "knowledge collections are not available" in error["message"]


async def test_pairs_from_collections_take_their_owner_and_never_become_public(api: Api) -> None:
    api.admin.state.collection_pairs = Collections(
        {
            "faq": (Owner.parse("team:acme/ml"), [("q1", "a1")]),
            "web": (Owner.parse("team:acme/web"), [("q2", "a2")]),
        }
    )
    async with await api.user("mia", "member", "team:acme/ml") as mia:
        answer = await mia.post("/api/training/jobs", json=submit(pairs="", pairs_from=["faq"]))
        assert answer.status_code == 201, answer.text
        assert (answer.json()["owner"], answer.json()["collections"]) == ("team:acme/ml", ["faq"])
        await refused(mia, submit(pairs="", pairs_from=["faq", "web"]), 404)  # mia may not read web
        await refused(mia, submit(pairs="", pairs_from=["missing"]), 404)
    error = await refused(api.client, submit(pairs="", pairs_from=["faq", "web"]))
    assert "2 owners" in error["message"]
    error = await refused(api.client, submit(pairs="", pairs_from=["faq"], owner=""))
    assert "never become a public adapter" in error["message"]
    job_id = await succeeded_job(api, FITTING, pairs="", pairs_from=["faq"])
    public = await api.client.post(
        f"/api/training/jobs/{job_id}/publish", json={"name": "faq-bot", "owner": ""}
    )
    assert public.status_code == 400 and "never public" in public.json()["error"]["message"]


async def test_pairs_from_a_stored_collection_are_its_pairs_and_its_owner(api: Api) -> None:
    """The control plane's own CollectionPairs (what wiring sets) over the store's collection."""
    api.admin.state.collection_pairs = CollectionPairs(api.store.knowledge)
    await api.store.knowledge.create("faq", Owner.parse("team:acme/ml"), "minilm", "admin")
    await api.store.knowledge.set_pairs("faq", [("colour?", "blue"), ("size?", "small")])
    async with await api.user("mia", "member", "team:acme/ml") as mia:
        answer = await mia.post("/api/training/jobs", json=submit(pairs="", pairs_from=["faq"]))
        assert answer.status_code == 201, answer.text
        assert (answer.json()["owner"], answer.json()["collections"]) == ("team:acme/ml", ["faq"])
        missing = await refused(mia, submit(pairs="", pairs_from=["nothing"]), 404)
        assert "no knowledge collection 'nothing'" in missing["message"]
    job = await api.store.training.get(answer.json()["id"])
    assert job.pairs == pairs_bytes([("colour?", "blue"), ("size?", "small")])
    async with await api.user("leo", "member", "team:acme/web") as leo:  # a team that cannot read faq
        await refused(leo, submit(pairs="", pairs_from=["faq"]), 404)
