"""Sign-in with an OpenID Connect provider: its setting, PKCE, the ID token's claims, groups to roles.

The provider is one cluster setting, ``oidc.provider``, a JSON object
(docs/sign-in.md). Its client secret is never in it: the setting names an
environment variable (``client_secret_env``) or a file (``client_secret_file``)
of the control plane that holds it, so neither the settings table nor
``/api/settings`` ever shows it.

Policy kept here, free of I/O:

- PKCE is S256 only (:func:`pkce_pair`); ``state`` and ``nonce`` are fresh
  random strings per sign-in.
- An ID token is accepted only from the configured issuer, for this client
  (``aud`` holds it; with several audiences ``azp`` names it), unexpired
  (:data:`LEEWAY_S` of clock skew), and with the nonce the sign-in sent
  (:func:`claims_problem`).
- A user's roles are exactly what their groups map to (:func:`bindings_for`):
  a group the provider no longer lists takes its roles away at the next
  sign-in; one role per scope, the highest of the groups' wins.
- A session's CSRF token is derived from its secret (:func:`csrf_of`), so a
  page that cannot read the session cookie cannot forge it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmgw.core.tenancy import BOUND_AT, Binding, Owner, Role, check_name

OIDC_SETTING = "oidc.provider"
"""The cluster setting that holds the provider (absent: no sign-in with a provider)."""

LEEWAY_S = 60.0
"""Clock skew allowed between the provider and this control plane on ``exp`` and ``iat``."""

DEFAULT_SESSION_S = 8 * 3600.0
"""How long a session lives unless ``session_s`` says otherwise."""

_FIELDS = frozenset(
    {
        "name",
        "issuer",
        "client_id",
        "client_secret_env",
        "client_secret_file",
        "scopes",
        "groups_claim",
        "username_claim",
        "groups",
        "create_users",
        "session_s",
    }
)


@dataclass(frozen=True)
class Provider:
    """The provider as the setting describes it (see docs/sign-in.md for each field)."""

    issuer: str
    client_id: str
    name: str = "your organisation"
    client_secret_env: str = ""
    client_secret_file: str = ""
    scopes: tuple[str, ...] = ("openid", "profile", "email")
    groups_claim: str = "groups"
    username_claim: str = "preferred_username"
    groups: Mapping[str, tuple[Binding, ...]] = field(default_factory=dict)
    create_users: bool = True
    session_s: float = DEFAULT_SESSION_S


def _binding(group: str, item: Any) -> Binding:
    if not isinstance(item, dict) or not isinstance(item.get("role"), str):
        raise ValueError(f'groups.{group} takes an array of {{"role": ROLE, "scope": SCOPE}} objects')
    scope = Owner.parse(str(item.get("scope", "")))
    role = Role.parse(item["role"])
    if scope.kind not in BOUND_AT[role]:
        raise ValueError(f"groups.{group}: {role.label} cannot be bound at {scope or 'the cluster'}")
    return Binding(role, scope)


def parse_provider(value: Any) -> Provider:
    """The provider a setting's value describes; ValueError saying what is wrong otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"{OIDC_SETTING} takes a JSON object (docs/sign-in.md)")
    if "client_secret" in value:
        raise ValueError(
            "the client secret is not kept in a setting: name the control plane's environment variable "
            "(client_secret_env) or file (client_secret_file) that holds it"
        )
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise ValueError(
            f"{OIDC_SETTING} has no field {', '.join(unknown)}; its fields are {', '.join(sorted(_FIELDS))}"
        )
    for key in ("issuer", "client_id"):
        if not isinstance(value.get(key), str) or not value[key]:
            raise ValueError(f"{OIDC_SETTING}.{key} is needed, a JSON string")
    issuer = value["issuer"].rstrip("/")
    if not issuer.startswith(("https://", "http://")):
        raise ValueError(f"{OIDC_SETTING}.issuer must be an http(s) address, not {issuer!r}")
    texts = ("name", "client_secret_env", "client_secret_file", "groups_claim", "username_claim")
    for key in texts:
        if key in value and not isinstance(value[key], str):
            raise ValueError(f"{OIDC_SETTING}.{key} takes a JSON string")
    scopes = value.get("scopes", list(Provider.scopes))
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes) or "openid" not in scopes:
        raise ValueError(f'{OIDC_SETTING}.scopes takes a JSON array of strings holding "openid"')
    groups = value.get("groups", {})
    if not isinstance(groups, dict) or not all(isinstance(v, list) for v in groups.values()):
        raise ValueError(f'{OIDC_SETTING}.groups maps a group to an array of {{"role", "scope"}} objects')
    create = value.get("create_users", True)
    if create is not True and create is not False:
        raise ValueError(f"{OIDC_SETTING}.create_users takes a JSON bool")
    session_s = value.get("session_s", DEFAULT_SESSION_S)
    if (
        isinstance(session_s, bool)
        or not isinstance(session_s, int | float)
        or not 60 <= session_s <= 30 * 86400
    ):
        raise ValueError(f"{OIDC_SETTING}.session_s takes seconds between 60 and 2592000 (30 days)")
    return Provider(
        issuer=issuer,
        client_id=value["client_id"],
        name=value.get("name") or Provider.name,
        client_secret_env=value.get("client_secret_env", ""),
        client_secret_file=value.get("client_secret_file", ""),
        scopes=tuple(scopes),
        groups_claim=value.get("groups_claim") or Provider.groups_claim,
        username_claim=value.get("username_claim") or Provider.username_claim,
        groups={g: tuple(_binding(g, item) for item in items) for g, items in groups.items()},
        create_users=create,
        session_s=float(session_s),
    )


def provider_problem(value: Any) -> str:
    """Why ``value`` is no provider setting (empty: it is one)."""
    try:
        parse_provider(value)
    except ValueError as error:
        return str(error)
    return ""


def random_text(n: int = 32) -> str:
    """A fresh random URL-safe string (``state``, ``nonce``, a PKCE verifier)."""
    return secrets.token_urlsafe(n)


def s256(verifier: str) -> str:
    """The PKCE S256 challenge of ``verifier`` (RFC 7636 §4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def pkce_pair() -> tuple[str, str]:
    """A new PKCE verifier (43+ characters) and its S256 challenge."""
    verifier = random_text(48)
    return verifier, s256(verifier)


def claims_problem(claims: Mapping[str, Any], provider: Provider, nonce: str, now: float) -> str:
    """Why the ID token's ``claims`` are not to be accepted (empty: they are)."""
    if claims.get("iss") != provider.issuer:
        return f"the ID token is from {claims.get('iss')!r}, not the issuer {provider.issuer!r}"
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else list(aud) if isinstance(aud, list) else []
    if provider.client_id not in audiences:
        return f"the ID token is not for the client {provider.client_id!r}"
    if len(audiences) > 1 and claims.get("azp") != provider.client_id:
        return "the ID token has several audiences and its azp is not this client"
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool) or exp + LEEWAY_S <= now:
        return "the ID token has expired"
    iat = claims.get("iat")
    if isinstance(iat, int | float) and iat - LEEWAY_S > now:
        return "the ID token was issued in the future: check the clocks"
    given = claims.get("nonce")
    if not isinstance(given, str) or not hmac.compare_digest(given, nonce):
        return "the ID token's nonce is not the one this sign-in sent"
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        return "the ID token names no subject (sub)"
    return ""


def user_name(claims: Mapping[str, Any], provider: Provider) -> str:
    """The llmgw user the claims name (the ``username_claim``, an e-mail's part before @); ValueError
    when it is missing or no valid user name."""
    value = claims.get(provider.username_claim)
    if not isinstance(value, str) or not value:
        raise ValueError(f"the provider sent no {provider.username_claim!r} claim to name the user by")
    return check_name(value.split("@", 1)[0] if provider.username_claim == "email" else value, "user name")


def groups_of(claims: Mapping[str, Any], provider: Provider) -> tuple[str, ...]:
    """The groups the claims list (none when the claim is absent; a single string is one group)."""
    value = claims.get(provider.groups_claim)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(g for g in value if isinstance(g, str))
    return ()


def bindings_for(groups: Iterable[str], mapping: Mapping[str, tuple[Binding, ...]]) -> tuple[Binding, ...]:
    """The roles the groups map to: one per scope, the highest; groups without a mapping give none."""
    best: dict[Owner, Role] = {}
    for group in groups:
        for binding in mapping.get(group, ()):
            held = best.get(binding.scope)
            if held is None or binding.role > held:
                best[binding.scope] = binding.role
    return tuple(Binding(role, scope) for scope, role in sorted(best.items(), key=lambda kv: str(kv[0])))


def csrf_of(secret: str) -> str:
    """The CSRF token of the session whose secret is ``secret``."""
    return hmac.new(secret.encode(), b"llmgw csrf", hashlib.sha256).hexdigest()


def csrf_matches(secret: str, given: str) -> bool:
    return bool(given) and hmac.compare_digest(csrf_of(secret), given)
