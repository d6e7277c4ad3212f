"""/api with users' tokens: roles checked against the owner of what a route touches, tokens that
expire and are revoked, and the audit log naming who acted — over ASGI with a real SQLite store."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store
from llmgw.testing.clock import FakeClock

TOKEN = "llmgw-admin-test"


@dataclass
class Cluster:
    app: Admission
    store: Store
    clock: FakeClock
    admin: httpx.AsyncClient = field(init=False)

    def as_user(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
            base_url="http://cp",
            headers={"Authorization": f"Bearer {token}"},
        )

    async def user(self, name: str, *roles: tuple[str, str]) -> httpx.AsyncClient:
        assert (await self.admin.post("/api/users", json={"name": name})).status_code == 201
        for role, scope in roles:
            answer = await self.admin.put(f"/api/users/{name}/roles", json={"role": role, "scope": scope})
            assert answer.status_code == 200, answer.text
        created = await self.admin.post(f"/api/users/{name}/tokens", json={"name": "test"})
        assert created.status_code == 201
        return self.as_user(created.json()["token"])

    async def mirrored(self) -> str:
        answer = await self.admin.post("/api/mirror/blobs", params={"filename": "m.gguf"}, content=b"GGUF")
        return str(answer.json()["sha256"])


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    clock = FakeClock()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}", clock=clock)
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    sha = hashlib.sha256(TOKEN.encode()).hexdigest()
    callers = Callers(sha, clock=clock)

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
    app = Admission(admin.app(), callers, 8 << 20)  # as served: tokens checked before bodies
    tree = Cluster(app, store, clock)
    tree.admin = tree.as_user(TOKEN)
    async with tree.admin:
        for path, body in (
            ("/api/orgs", {"name": "acme"}),
            ("/api/teams", {"org": "acme", "name": "ml"}),
            ("/api/teams", {"org": "acme", "name": "web"}),
            ("/api/projects", {"org": "acme", "team": "ml", "name": "chat"}),
            ("/api/projects", {"org": "acme", "team": "web", "name": "shop"}),
        ):
            assert (await tree.admin.post(path, json=body)).status_code == 201
        yield tree
    await store.close()


def model(name: str, sha: str, owner: str = "") -> dict[str, object]:
    return {"name": name, "source": {"sha256": sha}, "owner": owner}


async def test_a_viewer_cannot_add_a_model_and_is_told_the_role_needed(cluster: Cluster) -> None:
    sha = await cluster.mirrored()
    async with await cluster.user("vera", ("viewer", "team:acme/ml")) as vera:
        answer = await vera.post("/api/models", json=model("m", sha, "team:acme/ml"))
    assert answer.status_code == 403
    assert "needs member; viewer held" in answer.json()["error"]["message"]
    assert answer.json()["error"]["hint"]
    assert (await cluster.admin.get("/api/models")).json() == []


async def test_a_member_adds_a_model_of_its_team_but_not_of_another(cluster: Cluster) -> None:
    sha = await cluster.mirrored()
    async with await cluster.user("mia", ("member", "team:acme/ml")) as mia:
        assert (
            await mia.post("/api/models", json=model("ml-m", sha, "project:acme/ml/chat"))
        ).status_code == 201
        assert (await mia.post("/api/models", json=model("web-m", sha, "team:acme/web"))).status_code == 403
        assert (await mia.post("/api/models", json=model("pub", sha))).status_code == 403


async def test_a_team_admin_manages_its_teams_projects_but_not_another_teams(cluster: Cluster) -> None:
    async with await cluster.user("tom", ("team-admin", "team:acme/ml")) as tom:
        mine = await tom.post("/api/projects", json={"org": "acme", "team": "ml", "name": "eval"})
        theirs = await tom.post("/api/projects", json={"org": "acme", "team": "web", "name": "eval"})
        removed = await tom.delete("/api/projects/acme/ml/eval")
        not_removed = await tom.delete("/api/projects/acme/web/shop")
        listed = [p["path"] for p in (await tom.get("/api/projects")).json()]
        team = await tom.post("/api/teams", json={"org": "acme", "name": "ops"})
    assert (mine.status_code, theirs.status_code) == (201, 403)
    assert (removed.status_code, not_removed.status_code) == (204, 403)
    assert listed == ["acme/ml/chat"]
    assert team.status_code == 403


async def test_a_team_admin_adds_members_to_its_team_up_to_its_own_role(cluster: Cluster) -> None:
    assert (await cluster.admin.post("/api/users", json={"name": "new"})).status_code == 201
    async with await cluster.user("tom", ("team-admin", "team:acme/ml")) as tom:
        member = await tom.put("/api/users/new/roles", json={"role": "member", "scope": "team:acme/ml"})
        other_team = await tom.put("/api/users/new/roles", json={"role": "member", "scope": "team:acme/web"})
        above = await tom.put("/api/users/new/roles", json={"role": "org-admin", "scope": "org:acme"})
    assert member.status_code == 200 and member.json()["roles"] == [
        {"role": "member", "scope": "team:acme/ml"}
    ]
    assert (other_team.status_code, above.status_code) == (403, 403)


async def test_a_model_of_another_team_does_not_exist_for_its_member(cluster: Cluster) -> None:
    sha = await cluster.mirrored()
    assert (
        await cluster.admin.post("/api/models", json=model("web-m", sha, "team:acme/web"))
    ).status_code == 201
    assert (await cluster.admin.post("/api/models", json=model("pub", sha))).status_code == 201
    async with await cluster.user("mia", ("member", "team:acme/ml")) as mia:
        listed = [m["name"] for m in (await mia.get("/api/models")).json()]
        one = await mia.get("/api/models/web-m")
        removed = await mia.delete("/api/models/web-m")
        scaled = await mia.put("/api/models/web-m/replicas", json={"max": 2})
        public = await mia.put("/api/models/pub/replicas", json={"max": 2})
    assert listed == ["pub"]
    assert (one.status_code, removed.status_code, scaled.status_code) == (404, 404, 404)
    assert public.status_code == 403, "a public model is seen by all but scaled by an operator"


async def test_a_key_is_created_in_a_project_by_a_member_and_listed_to_its_team_only(
    cluster: Cluster,
) -> None:
    async with await cluster.user("mia", ("member", "team:acme/ml")) as mia:
        created = await mia.post("/api/keys", json={"name": "chat-ci", "place": "project:acme/ml/chat"})
        refused = await mia.post("/api/keys", json={"name": "shop-ci", "place": "project:acme/web/shop"})
        nowhere = await mia.post("/api/keys", json={"name": "any"})
    assert (created.status_code, refused.status_code, nowhere.status_code) == (201, 403, 403)
    await cluster.admin.post("/api/keys", json={"name": "shop-ci", "place": "project:acme/web/shop"})
    async with await cluster.user("wes", ("viewer", "team:acme/web")) as wes:
        seen = [k["name"] for k in (await wes.get("/api/keys")).json()]
    assert seen == ["shop-ci"]


async def test_a_user_makes_keys_of_their_own(cluster: Cluster) -> None:
    async with await cluster.user("ann") as ann:
        mine = await ann.post("/api/keys", json={"name": "ann-laptop", "place": "user:ann"})
        theirs = await ann.post("/api/keys", json={"name": "bob-laptop", "place": "user:bob"})
    assert (mine.status_code, theirs.status_code) == (201, 403)
    assert mine.json()["key"].startswith("sk-llmgw-")


async def test_a_users_token_stops_working_when_it_expires(cluster: Cluster) -> None:
    await cluster.admin.post("/api/users", json={"name": "eve"})
    created = await cluster.admin.post("/api/users/eve/tokens", json={"name": "short", "expires_in_s": 60})
    async with cluster.as_user(created.json()["token"]) as eve:
        assert (await eve.get("/api/me")).json()["name"] == "eve"
        await cluster.clock.advance(61)
        expired = await eve.get("/api/me")
    assert expired.status_code == 401
    assert "expired" in expired.json()["error"]["message"]


async def test_a_revoked_token_is_refused_at_once_and_only_its_user_or_an_admin_revokes_it(
    cluster: Cluster,
) -> None:
    async with await cluster.user("eve") as eve, await cluster.user("mal") as mal:
        [token] = (await eve.get("/api/users/eve/tokens")).json()
        assert (await mal.get("/api/users/eve/tokens")).status_code == 403
        assert (await mal.delete(f"/api/tokens/{token['id']}")).status_code == 404
        assert (await eve.delete(f"/api/tokens/{token['id']}")).status_code == 204
        assert (await eve.get("/api/me")).status_code == 401


async def test_the_audit_log_names_the_user_or_admin(cluster: Cluster) -> None:
    async with await cluster.user("tom", ("team-admin", "team:acme/ml")) as tom:
        await tom.post("/api/projects", json={"org": "acme", "team": "ml", "name": "eval"})
    actors = {(a["actor"], a["action"], a["target"]) for a in (await cluster.admin.get("/api/audit")).json()}
    assert ("tom", "project.create", "project:acme/ml/eval") in actors
    assert ("admin", "org.create", "org:acme") in actors


async def test_the_clusters_machinery_is_read_by_a_cluster_viewer_and_changed_by_an_admin_only(
    cluster: Cluster,
) -> None:
    async with await cluster.user("olga", ("org-admin", "org:acme")) as olga:
        assert (await olga.get("/api/nodes")).status_code == 403
        assert (await olga.put("/api/serving", json={"stopped": True})).status_code == 403
        assert (await olga.get("/api/status")).status_code == 200
    async with await cluster.user("cleo", ("viewer", "")) as cleo:
        assert (await cleo.get("/api/nodes")).status_code == 200
        assert (await cleo.put("/api/serving", json={"stopped": True})).status_code == 403


async def test_removing_a_project_that_holds_a_key_is_refused(cluster: Cluster) -> None:
    await cluster.admin.post("/api/keys", json={"name": "k", "place": "project:acme/ml/chat"})
    answer = await cluster.admin.delete("/api/projects/acme/ml/chat")
    assert answer.status_code == 409
    assert "revoke those keys" in answer.json()["error"]["hint"]


async def test_a_model_owned_by_an_owner_that_does_not_exist_is_refused(cluster: Cluster) -> None:
    sha = await cluster.mirrored()
    answer = await cluster.admin.post("/api/models", json=model("m", sha, "team:acme/nope"))
    assert answer.status_code == 400
    assert answer.json()["error"]["problems"][0]["field"] == "owner"
