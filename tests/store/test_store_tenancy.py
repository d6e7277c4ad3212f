"""Organizations, teams, projects, users, role bindings, user tokens, and owners on models and keys."""

from __future__ import annotations

from datetime import timedelta

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.core.tenancy import CLUSTER, Binding, Owner, OwnerKind, Role
from llmgw.errors import Conflict, NotFound, ValidationFailed
from llmgw.store import Store
from llmgw.store.database import MIGRATIONS
from llmgw.testing.clock import FakeClock

ACME = Owner(OwnerKind.ORG, "acme")
ML = Owner(OwnerKind.TEAM, "acme/ml")
CHAT = Owner(OwnerKind.PROJECT, "acme/ml/chat")


async def tree(store: Store) -> None:
    await store.tenants.create(OwnerKind.ORG, "acme")
    await store.tenants.create(OwnerKind.TEAM, "acme/ml")
    await store.tenants.create(OwnerKind.PROJECT, "acme/ml/chat")


async def test_an_org_holds_teams_which_hold_projects(store: Store) -> None:
    await tree(store)
    await store.tenants.create(OwnerKind.TEAM, "acme/web")
    assert [u.path for u in await store.tenants.list(OwnerKind.TEAM)] == ["acme/ml", "acme/web"]
    assert [u.owner for u in await store.tenants.list(OwnerKind.PROJECT, within="acme/ml")] == [CHAT]
    assert await store.tenants.exists(CHAT)


async def test_a_team_in_an_org_that_does_not_exist_is_refused(store: Store) -> None:
    with pytest.raises(NotFound, match="org:nope does not exist"):
        await store.tenants.create(OwnerKind.TEAM, "nope/ml")


async def test_the_same_project_twice_is_a_conflict(store: Store) -> None:
    await tree(store)
    with pytest.raises(Conflict):
        await store.tenants.create(OwnerKind.PROJECT, "acme/ml/chat")


async def test_a_malformed_name_is_refused_naming_the_field(store: Store) -> None:
    with pytest.raises(ValidationFailed) as caught:
        await store.tenants.create(OwnerKind.ORG, "a b")
    assert caught.value.problems[0][0] == "name"


async def test_removing_an_org_takes_its_teams_projects_and_roles_bound_there(store: Store) -> None:
    await tree(store)
    await store.users.create("alice")
    await store.users.bind("alice", Binding(Role.TEAM_ADMIN, ML))
    await store.users.bind("alice", Binding(Role.VIEWER))
    await store.tenants.remove(OwnerKind.ORG, "acme")
    assert await store.tenants.list(OwnerKind.PROJECT) == []
    assert (await store.users.get("alice")).bindings == (Binding(Role.VIEWER),)


async def test_a_project_owning_a_model_or_holding_a_key_is_not_removed(store: Store) -> None:
    await tree(store)
    await store.models.add("private", {"name": "private", "owner": "project:acme/ml/chat"})
    with pytest.raises(Conflict, match="1 model"):
        await store.tenants.remove(OwnerKind.TEAM, "acme/ml")
    await store.models.remove("private")
    key, _ = await store.keys.create("k", place=CHAT)
    with pytest.raises(Conflict, match="1 active key"):
        await store.tenants.remove(OwnerKind.PROJECT, "acme/ml/chat")
    await store.keys.revoke(key.id)
    await store.tenants.remove(OwnerKind.PROJECT, "acme/ml/chat")


async def test_a_model_keeps_its_definitions_owner_in_columns(store: Store) -> None:
    await store.models.add("m", {"name": "m", "owner": "team:acme/ml"})
    assert (await store.models.get("m")).owner == ML
    await store.models.put("m", {"name": "m"})
    assert (await store.models.get("m")).owner == CLUSTER


async def test_a_key_sits_in_a_project_or_with_a_user_only(store: Store) -> None:
    await store.keys.create("k", place=CHAT)
    assert (await store.keys.find("k")).place == CHAT
    with pytest.raises(ValidationFailed):
        await store.keys.create("t", place=ML)


async def test_a_user_holds_one_role_per_scope_and_a_new_one_replaces_it(store: Store) -> None:
    await store.users.create("alice")
    await store.users.bind("alice", Binding(Role.VIEWER, ML))
    await store.users.bind("alice", Binding(Role.TEAM_ADMIN, ML))
    await store.users.bind("alice", Binding(Role.MEMBER, ACME))
    assert (await store.users.bindings())["alice"] == [
        Binding(Role.TEAM_ADMIN, ML),
        Binding(Role.MEMBER, ACME),
    ]
    await store.users.unbind("alice", ML)
    assert (await store.users.get("alice")).bindings == (Binding(Role.MEMBER, ACME),)
    with pytest.raises(NotFound):
        await store.users.unbind("alice", ML)


async def test_removing_a_user_takes_their_roles_and_tokens(store: Store) -> None:
    await store.users.create("alice")
    await store.users.bind("alice", Binding(Role.MEMBER))
    await store.tokens.create("alice", "laptop")
    await store.users.remove("alice")
    assert await store.users.bindings() == {}
    assert await store.tokens.list() == []


async def test_a_token_lives_until_it_expires(store: Store, clock: FakeClock) -> None:
    await store.users.create("alice")
    token, secret = await store.tokens.create("alice", "ci", expires_at=store.now() + timedelta(hours=1))
    assert secret.startswith("llmgw-ut-") and token.prefix == secret[len("llmgw-ut-") :][:8]
    assert [t.id for t in await store.tokens.live()] == [token.id]
    await clock.advance(3601)
    assert await store.tokens.live() == []
    assert [t.id for t in await store.tokens.list("alice")] == [token.id]


async def test_a_revoked_token_is_no_longer_live(store: Store) -> None:
    await store.users.create("alice")
    token, _ = await store.tokens.create("alice", "ci")
    revoked = await store.tokens.revoke(token.id)
    assert revoked.revoked_at is not None and not revoked.live(store.now())
    assert await store.tokens.live() == []


async def test_a_token_that_would_expire_at_once_is_refused(store: Store) -> None:
    await store.users.create("alice")
    with pytest.raises(ValidationFailed, match="expires_at"):
        await store.tokens.create("alice", "ci", expires_at=store.now())


async def test_the_migration_turns_owner_labels_into_owners(store_url: str) -> None:
    def to_0003(connection: Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("path_separator", "os")
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")

    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(to_0003)
            for name, owner in (("labelled", "team-a"), ("owned", "project:acme/ml/chat")):
                await connection.execute(
                    text(
                        "INSERT INTO models (name, definition, created_at, updated_at) "
                        "VALUES (:name, :definition, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"name": name, "definition": f'{{"name": "{name}", "owner": "{owner}"}}'},
                )
    finally:
        await engine.dispose()
    store = await Store.open(store_url)
    try:
        labelled, owned = await store.models.get("labelled"), await store.models.get("owned")
    finally:
        await store.close()
    assert (labelled.owner, labelled.definition["owner"]) == (CLUSTER, "")
    assert (owned.owner, owned.definition["owner"]) == (CHAT, "project:acme/ml/chat")
