"""Owners, places, visibility and roles: the pure rules of tenancy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.tenancy import (
    CLUSTER,
    NOWHERE,
    Action,
    Binding,
    Owner,
    OwnerKind,
    Place,
    Role,
    may,
    may_as,
    user_place,
    visible,
)

ACME = Owner(OwnerKind.ORG, "acme")
ML = Owner(OwnerKind.TEAM, "acme/ml")
WEB = Owner(OwnerKind.TEAM, "acme/web")
CHAT = Owner(OwnerKind.PROJECT, "acme/ml/chat")
SEARCH = Owner(OwnerKind.PROJECT, "acme/ml/search")
SHOP = Owner(OwnerKind.PROJECT, "acme/web/shop")
ALICE = Owner(OwnerKind.USER, "alice")

names = st.from_regex(r"[a-z0-9][a-z0-9-]{0,8}", fullmatch=True)
orgs = names.map(lambda n: Owner(OwnerKind.ORG, n))
teams = st.tuples(names, names).map(lambda p: Owner(OwnerKind.TEAM, "/".join(p)))
projects = st.tuples(names, names, names).map(lambda p: Owner(OwnerKind.PROJECT, "/".join(p)))
users = names.map(lambda n: Owner(OwnerKind.USER, n))
owners = st.one_of(st.just(CLUSTER), orgs, teams, projects, users)


@given(owners)
def test_an_owner_reads_back_from_its_text(owner: Owner) -> None:
    assert Owner.parse(str(owner)) == owner


@pytest.mark.parametrize(
    "text", ["acme", "org:", "team:acme", "project:acme/ml", "user:a/b", "org:-x", "group:acme"]
)
def test_a_malformed_owner_is_refused_naming_the_shapes(text: str) -> None:
    with pytest.raises(ValueError, match=r"org|team|project|user|letter"):
        Owner.parse(text)


def test_a_project_key_sees_public_its_project_team_and_org_only() -> None:
    place = Place(CHAT)
    assert [visible(o, place) for o in (CLUSTER, CHAT, ML, ACME)] == [True] * 4
    assert [visible(o, place) for o in (SEARCH, WEB, SHOP, ALICE)] == [False] * 4


def test_a_key_of_no_place_sees_public_things_only() -> None:
    assert visible(CLUSTER, NOWHERE)
    assert not visible(ACME, NOWHERE)


def test_a_user_sees_own_things_and_those_of_teams_and_orgs_belonged_to() -> None:
    place = user_place("alice", [Binding(Role.MEMBER, ML)])
    assert [visible(o, place) for o in (ALICE, ML, ACME, CLUSTER)] == [True] * 4
    assert [visible(o, place) for o in (CHAT, WEB, Owner(OwnerKind.USER, "bob"))] == [False] * 3


@given(owners, owners)
def test_a_thing_is_visible_exactly_when_public_or_owned_at_or_above_the_place(
    owner: Owner, at: Owner
) -> None:
    assert visible(owner, Place(at)) == (owner.public or at.within(owner))


def test_the_chain_a_project_keys_use_counts_against_is_nearest_first_without_the_cluster() -> None:
    assert Place(CHAT).chain == (CHAT, ML, ACME)
    assert NOWHERE.chain == ()


def test_roles_are_ordered_from_viewer_to_cluster_admin() -> None:
    assert Role.VIEWER < Role.MEMBER < Role.TEAM_ADMIN < Role.ORG_ADMIN < Role.CLUSTER_ADMIN
    assert Role.parse("team-admin") is Role.TEAM_ADMIN


def test_a_role_bound_where_it_does_not_belong_is_refused() -> None:
    with pytest.raises(ValueError, match="bound at the team"):
        Binding(Role.TEAM_ADMIN, ACME)
    with pytest.raises(ValueError, match="bound at the cluster"):
        Binding(Role.CLUSTER_ADMIN, ML)


def test_a_viewer_reads_but_may_not_write() -> None:
    viewer = [Binding(Role.VIEWER, ML)]
    assert may(viewer, Action.READ, CHAT)
    refused = may(viewer, Action.WRITE, CHAT)
    assert not refused and "needs member; viewer held" in refused.reason


def test_a_team_admin_manages_its_teams_projects_but_not_another_teams() -> None:
    admin = [Binding(Role.TEAM_ADMIN, ML)]
    assert may(admin, Action.MANAGE, ML)
    assert may(admin, Action.MANAGE, CHAT)
    refused = may(admin, Action.MANAGE, WEB)
    assert not refused and "none held" in refused.reason
    assert not may(admin, Action.MANAGE, ACME)


def test_only_a_cluster_admin_operates_the_cluster() -> None:
    assert may([Binding(Role.CLUSTER_ADMIN)], Action.OPERATE, CLUSTER)
    assert not may([Binding(Role.ORG_ADMIN, ACME)], Action.OPERATE, CLUSTER)
    assert not may([Binding(Role.MEMBER)], Action.OPERATE, CLUSTER)


def test_a_user_writes_what_the_user_owns_without_any_binding() -> None:
    assert may_as("alice", [], Action.WRITE, ALICE)
    assert not may_as("alice", [], Action.WRITE, Owner(OwnerKind.USER, "bob"))
    assert not may_as("alice", [], Action.OPERATE, ALICE)


bindings = st.one_of(
    st.sampled_from([Role.VIEWER, Role.MEMBER, Role.CLUSTER_ADMIN]).map(Binding),
    st.tuples(st.sampled_from([Role.VIEWER, Role.MEMBER, Role.ORG_ADMIN]), orgs).map(lambda b: Binding(*b)),
    st.tuples(st.sampled_from([Role.VIEWER, Role.MEMBER, Role.TEAM_ADMIN]), teams).map(lambda b: Binding(*b)),
)


@given(st.lists(bindings, max_size=3), bindings, st.sampled_from(list(Action)), owners)
def test_another_binding_never_takes_a_permission_away(
    held: list[Binding], extra: Binding, action: Action, owner: Owner
) -> None:
    if may(held, action, owner):
        assert may([*held, extra], action, owner)
