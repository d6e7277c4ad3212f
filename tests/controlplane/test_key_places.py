"""Where the control plane says a key sits when it feeds the gateway: a project, or a user with the
teams and organizations the user holds a role in."""

from __future__ import annotations

from llmgw.controlplane.parts import key_place
from llmgw.core.tenancy import CLUSTER, NOWHERE, Binding, Owner, OwnerKind, Place, Role

ACME = Owner(OwnerKind.ORG, "acme")
ML = Owner(OwnerKind.TEAM, "acme/ml")
CHAT = Owner(OwnerKind.PROJECT, "acme/ml/chat")
ALICE = Owner(OwnerKind.USER, "alice")


def test_a_users_key_reaches_the_users_teams_and_their_orgs() -> None:
    bindings = {"alice": [Binding(Role.MEMBER, ML)]}
    assert key_place(ALICE, bindings).reach == {ALICE, ML, ACME}


def test_a_key_of_a_user_without_roles_reaches_the_user_only() -> None:
    assert key_place(ALICE, {}).reach == {ALICE}


def test_a_project_key_sits_in_its_project_and_a_key_of_no_place_nowhere() -> None:
    assert key_place(CHAT, {"alice": [Binding(Role.MEMBER, ML)]}) == Place(CHAT)
    assert key_place(CLUSTER, {}) == NOWHERE
