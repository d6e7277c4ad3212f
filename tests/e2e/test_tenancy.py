"""Tenancy on a real control plane process: two projects' keys each see their own private model and
not the other's, both see the public one; a user's token works on /api as the user's role allows."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from llmgw.client.admin import AdminClient
from llmgw.errors import Forbidden, Unauthorized
from llmgw.testing.cluster import Cluster


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane alone (no node: the models are listed, never started)."""
    with Cluster(tmp_path_factory.mktemp("tenancy"), tmp_path_factory.mktemp("cache")) as running:
        running.start_server()
        yield running


def v1(cluster: Cluster, key: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        cluster.url + path,
        data=data,
        method="GET" if body is None else "POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_two_projects_keys_see_their_own_private_models_and_the_public_one(control_plane: Cluster) -> None:
    admin = control_plane.admin
    admin.create_unit("orgs", {"name": "acme"})
    for team, project in (("ml", "chat"), ("web", "shop")):
        admin.create_unit("teams", {"org": "acme", "name": team})
        admin.create_unit("projects", {"org": "acme", "team": team, "name": project})
    sha = control_plane.upload(filename="tiny.gguf", data=b"GGUF tenancy")["sha256"]
    for name, owner in (
        ("public", ""),
        ("chat-only", "project:acme/ml/chat"),
        ("shop-only", "project:acme/web/shop"),
    ):
        admin.add_model({"name": name, "source": {"sha256": sha}, "owner": owner, "replicas": {"min": 0}})

    admin.create_user("mia")
    admin.bind_role("mia", "member", "team:acme/ml")
    as_mia = AdminClient(control_plane.url, admin.create_token("mia", "e2e", 3600).token)
    chat_key = as_mia.create_key(
        "chat", place="project:acme/ml/chat"
    ).key  # a user's token, through admission
    with pytest.raises(Forbidden):
        as_mia.create_key("shop", place="project:acme/web/shop")
    shop_key = admin.create_key("shop", place="project:acme/web/shop").key

    for key, own, other in ((chat_key, "chat-only", "shop-only"), (shop_key, "shop-only", "chat-only")):
        status, listing = v1(control_plane, key, "/v1/models")
        assert status == 200
        assert sorted(m["id"] for m in listing["data"]) == sorted([own, "public"])
        assert v1(control_plane, key, f"/v1/models/{own}")[0] == 200
        status, refused = v1(control_plane, key, "/v1/chat/completions", {"model": other, "messages": []})
        assert status == 404 and refused["error"]["code"] == "model_not_found"
        never = v1(control_plane, key, "/v1/chat/completions", {"model": "never-defined", "messages": []})[1]
        assert refused["error"]["message"].replace(other, "never-defined") == never["error"]["message"]

    audit = admin.audit(50)
    assert any(a.actor == "mia" and a.action == "key.create" for a in audit)


def test_a_revoked_users_token_is_refused_by_the_running_control_plane(control_plane: Cluster) -> None:
    admin = control_plane.admin
    admin.create_user("rex")
    created = admin.create_token("rex", "e2e", None)
    as_rex = AdminClient(control_plane.url, created.token)
    assert as_rex.me().name == "rex"
    admin.revoke_token(created.id)
    with pytest.raises(Unauthorized, match="revoked"):
        as_rex.me()
