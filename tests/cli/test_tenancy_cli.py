"""``llmgw ctl org|team|project|user``: the tree, members with roles, and users' tokens, end to end
through a real admin API."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmgw.adminapi.tenancy import TokenView, UnitView, UserView
from llmgw.cli.main import app

from .conftest import AdminServer


def run(server: AdminServer, *args: str, token: str | None = None, code: int = 0) -> str:
    options = ["--url", server.url, "--token", token or server.token]
    answer = CliRunner().invoke(app, [*args, *options], env={"COLUMNS": "200"})
    assert answer.exit_code == code, answer.output
    return answer.stdout


def test_a_tree_is_built_and_listed_as_json(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "org", "create", "acme")
    run(admin_server, "ctl", "team", "create", "acme/ml")
    run(admin_server, "ctl", "project", "create", "acme/ml/chat")
    projects = [
        UnitView.model_validate(p) for p in json.loads(run(admin_server, "ctl", "project", "list", "--json"))
    ]
    assert [(p.owner, p.path) for p in projects] == [("project:acme/ml/chat", "acme/ml/chat")]
    teams = json.loads(run(admin_server, "ctl", "team", "list", "--in", "acme", "--json"))
    assert [t["path"] for t in teams] == ["acme/ml"]
    run(admin_server, "ctl", "project", "delete", "acme/ml/chat")
    assert json.loads(run(admin_server, "ctl", "project", "list", "--json")) == []


def test_a_malformed_path_is_refused_saying_its_shape(admin_server: AdminServer) -> None:
    answer = CliRunner().invoke(
        app, ["ctl", "team", "create", "acme", "--url", admin_server.url, "--token", "x"]
    )
    assert answer.exit_code != 0
    assert "ORG/TEAM" in answer.output


def test_a_member_gets_a_token_that_acts_with_its_role(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "org", "create", "acme")
    run(admin_server, "ctl", "team", "create", "acme/ml")
    run(admin_server, "ctl", "user", "create", "alice")
    run(admin_server, "ctl", "team", "add-member", "acme/ml", "alice", "--role", "team-admin")
    [alice] = [
        UserView.model_validate(u) for u in json.loads(run(admin_server, "ctl", "user", "list", "--json"))
    ]
    assert [(r.role, r.scope) for r in alice.roles] == [("team-admin", "team:acme/ml")]
    shown = run(admin_server, "ctl", "user", "token", "create", "alice", "laptop", "--expires-in", "30d")
    secret = shown.strip().splitlines()[-1]
    assert secret.startswith("llmgw-ut-")
    assert json.loads(run(admin_server, "ctl", "user", "whoami", "--json", token=secret))["name"] == "alice"
    run(admin_server, "ctl", "project", "create", "acme/ml/chat", token=secret)
    refused = run(admin_server, "ctl", "org", "create", "other", token=secret, code=1)
    assert refused == ""
    [token] = [
        TokenView.model_validate(t)
        for t in json.loads(run(admin_server, "ctl", "user", "token", "list", "alice", "--json"))
    ]
    assert token.expires_at is not None
    run(admin_server, "ctl", "user", "token", "revoke", token.id)
    run(admin_server, "ctl", "user", "whoami", token=secret, code=1)


def test_a_key_is_created_in_a_project(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "org", "create", "acme")
    run(admin_server, "ctl", "team", "create", "acme/ml")
    run(admin_server, "ctl", "project", "create", "acme/ml/chat")
    run(admin_server, "ctl", "key", "create", "chat-ci", "--project", "acme/ml/chat")
    [key] = json.loads(run(admin_server, "ctl", "key", "list", "--json"))
    assert key["place"] == "project:acme/ml/chat"


def test_a_key_is_created_with_default_knowledge_collections(admin_server: AdminServer) -> None:
    run(admin_server, "ctl", "key", "create", "kb-ci", "--collections", "handbook, runbook")
    [key] = [k for k in json.loads(run(admin_server, "ctl", "key", "list", "--json")) if k["name"] == "kb-ci"]
    assert key["collections"] == ["handbook", "runbook"]
