"""The pure parts of sign-in with an OpenID Connect provider: the setting, PKCE, the ID token's claims,
groups to roles, and the session's CSRF token."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from llmgw.core.oidc import (
    LEEWAY_S,
    OIDC_SETTING,
    bindings_for,
    claims_problem,
    csrf_matches,
    csrf_of,
    groups_of,
    parse_provider,
    pkce_pair,
    provider_problem,
    s256,
    user_name,
)
from llmgw.core.settingtypes import key_problem, value_problem
from llmgw.core.tenancy import CLUSTER, Binding, Owner, Role

SETTING = {
    "issuer": "https://id.example.com/realms/acme/",
    "client_id": "llmgw",
    "client_secret_env": "LLMGW_OIDC_SECRET",
    "groups": {
        "ml": [{"role": "member", "scope": "team:acme/ml"}],
        "ml-leads": [{"role": "team-admin", "scope": "team:acme/ml"}],
        "ops": [{"role": "cluster-admin", "scope": ""}],
    },
}
NOW = 1_800_000_000.0


def claims(**changes: Any) -> dict[str, Any]:
    base = {
        "iss": "https://id.example.com/realms/acme",
        "aud": "llmgw",
        "sub": "u-1",
        "exp": NOW + 300,
        "iat": NOW,
        "nonce": "n-1",
        "preferred_username": "ada",
    }
    return {**base, **changes}


def test_the_pkce_challenge_is_rfc_7636_s256() -> None:
    # RFC 7636 appendix B's example
    assert (
        s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    )
    verifier, challenge = pkce_pair()
    assert 43 <= len(verifier) <= 128
    digest = hashlib.sha256(verifier.encode()).digest()
    assert challenge == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert pkce_pair()[0] != verifier


def test_the_setting_is_parsed_with_defaults_and_the_issuer_without_its_slash() -> None:
    provider = parse_provider(SETTING)
    assert provider.issuer == "https://id.example.com/realms/acme"
    assert provider.scopes == ("openid", "profile", "email") and provider.groups_claim == "groups"
    assert provider.create_users and provider.groups["ops"] == (Binding(Role.CLUSTER_ADMIN, CLUSTER),)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"client_secret": "s3cret"}, "not kept in a setting"),
        ({"issuer": "id.example.com"}, "http(s) address"),
        ({"client_id": ""}, "client_id is needed"),
        ({"scopes": ["profile"]}, '"openid"'),
        ({"groups": {"ml": [{"role": "team-admin", "scope": "org:acme"}]}}, "cannot be bound at org:acme"),
        ({"groups": {"ml": [{"role": "boss", "scope": ""}]}}, "is not one of"),
        ({"session_s": 5}, "between 60"),
        ({"clientid": "x"}, "has no field clientid"),
    ],
)
def test_a_wrong_setting_is_refused_saying_what_is_wrong(change: dict[str, Any], said: str) -> None:
    assert said in provider_problem({**SETTING, **change})
    assert said in value_problem(OIDC_SETTING, {**SETTING, **change})


def test_the_setting_is_a_known_key() -> None:
    assert key_problem(OIDC_SETTING) == ""
    assert value_problem(OIDC_SETTING, SETTING) == ""


def test_good_claims_pass_and_each_bad_one_is_named() -> None:
    provider = parse_provider(SETTING)
    assert claims_problem(claims(), provider, "n-1", NOW) == ""
    assert claims_problem(claims(aud=["other", "llmgw"], azp="llmgw"), provider, "n-1", NOW) == ""
    assert "not the issuer" in claims_problem(claims(iss="https://evil.example.com"), provider, "n-1", NOW)
    assert "not for the client" in claims_problem(claims(aud="other"), provider, "n-1", NOW)
    assert "azp" in claims_problem(claims(aud=["other", "llmgw"]), provider, "n-1", NOW)
    assert "expired" in claims_problem(claims(exp=NOW - LEEWAY_S - 1), provider, "n-1", NOW)
    assert claims_problem(claims(exp=NOW - LEEWAY_S + 1), provider, "n-1", NOW) == ""
    assert "future" in claims_problem(claims(iat=NOW + LEEWAY_S + 5), provider, "n-1", NOW)
    assert "nonce" in claims_problem(claims(), provider, "another", NOW)
    assert "nonce" in claims_problem(claims(nonce=None), provider, "n-1", NOW)
    assert "subject" in claims_problem(claims(sub=""), provider, "n-1", NOW)


def test_the_user_is_named_by_the_claim_the_setting_names() -> None:
    provider = parse_provider(SETTING)
    assert user_name(claims(), provider) == "ada"
    by_mail = parse_provider({**SETTING, "username_claim": "email"})
    assert user_name(claims(email="ada.l@example.com"), by_mail) == "ada.l"
    with pytest.raises(ValueError, match="no 'email' claim"):
        user_name(claims(), by_mail)
    with pytest.raises(ValueError, match="must start with a letter"):
        user_name(claims(preferred_username="ada lovelace"), provider)


def test_groups_map_to_one_role_per_scope_the_highest() -> None:
    provider = parse_provider(SETTING)
    ml = Owner.parse("team:acme/ml")
    assert groups_of(claims(groups=["ml", 7, "other"]), provider) == ("ml", "other")
    assert groups_of(claims(groups="ml"), provider) == ("ml",)
    assert groups_of(claims(), provider) == ()
    assert bindings_for(["ml"], provider.groups) == (Binding(Role.MEMBER, ml),)
    assert bindings_for(["ml", "ml-leads"], provider.groups) == (Binding(Role.TEAM_ADMIN, ml),)
    assert bindings_for(["ops", "ml"], provider.groups) == (
        Binding(Role.CLUSTER_ADMIN, CLUSTER),
        Binding(Role.MEMBER, ml),
    )
    assert bindings_for(["unmapped"], provider.groups) == ()


def test_the_csrf_token_is_the_sessions_own() -> None:
    assert csrf_matches("secret-a", csrf_of("secret-a"))
    assert not csrf_matches("secret-b", csrf_of("secret-a"))
    assert not csrf_matches("secret-a", "")
