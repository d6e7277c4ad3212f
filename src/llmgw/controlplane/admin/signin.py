"""Sign-in with the organisation's OpenID Connect provider, and the portal's session cookie.

``GET /auth/provider`` says whether a provider is set (``oidc.provider``,
:mod:`llmgw.core.oidc`) and its name; ``GET /auth/login`` sends the browser to
the provider (authorisation code with PKCE S256, ``state`` and ``nonce``
kept in a short-lived HttpOnly cookie); ``GET /auth/callback`` checks
``state``, exchanges the code (httpx, the client secret read from the
control plane's environment or a file), verifies the ID token with joserfc
against the provider's JWKS (cached; fetched again for a key id it does not
hold) and checks its claims; ``POST /auth/logout`` ends the session.

A session is a user token in the store (named :data:`SESSION_TOKEN`, with the
provider's ``session_s`` as its expiry): it survives a restart or a failover,
is listed and revoked like any token, and goes with the user when the user
is removed. Its secret is the ``llmgw_session`` cookie (``HttpOnly; Secure;
SameSite=Lax; Path=/``); ``llmgw_csrf``, readable by the page, holds the
session's CSRF token. At every sign-in the user is created when missing
(``create_users``) and their roles are set to what their groups map to.

:class:`SessionCookies` is pure ASGI and stands in front of the admission
layer: an ``/api`` request with the session cookie and no ``Authorization``
is let through as that session's bearer token, and a writing one (POST,
PUT, PATCH, DELETE) must carry ``X-CSRF-Token`` equal to the session's, or
it is answered 403. Bearer-token calls are untouched.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from llmgw.controlplane.api.errors import error_response
from llmgw.controlplane.api.state import State
from llmgw.core.oidc import (
    OIDC_SETTING,
    Provider,
    bindings_for,
    claims_problem,
    csrf_matches,
    csrf_of,
    groups_of,
    parse_provider,
    pkce_pair,
    random_text,
    user_name,
)
from llmgw.core.tenancy import CLUSTER, OwnerKind
from llmgw.store.database import Store

log = logging.getLogger(__name__)

SESSION_COOKIE = "llmgw_session"
CSRF_COOKIE = "llmgw_csrf"
FLOW_COOKIE = "llmgw_oidc"
"""The sign-in under way: state, nonce and PKCE verifier, for ten minutes."""
CSRF_HEADER = "x-csrf-token"
SESSION_TOKEN = "portal sign-in"
"""The name of the user tokens that are sessions."""
FLOW_S = 600
HTTP_TIMEOUT_S = 10.0
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"]
WRITING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ENDPOINTS = ("authorization_endpoint", "token_endpoint", "jwks_uri")
"""What this relying party reads from the provider's discovery document."""
ISSUER_HINT = "check oidc.provider.issuer: it must be the provider's issuer address"

CSRF_REFUSED = "a writing call signed in by the session cookie needs the X-CSRF-Token header"
CSRF_HINT = "send the llmgw_csrf cookie's value as X-CSRF-Token, or call with 'Authorization: Bearer <token>'"

router = APIRouter(prefix="/auth", tags=["sign-in"], include_in_schema=False)


class SignInError(Exception):
    """A sign-in that cannot go on: the status to answer, what went wrong and what to do."""

    def __init__(self, status: int, message: str, hint: str) -> None:
        super().__init__(message)
        self.status, self.message, self.hint = status, message, hint


class RelyingParty:
    """One provider's discovery document and JWKS, cached, and the code exchange."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self._metadata: dict[str, Any] | None = None
        self._keys: KeySet | None = None

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
                answer = await client.get(url)
                answer.raise_for_status()
                body: dict[str, Any] = answer.json()
                return body
        except (httpx.HTTPError, ValueError) as error:
            raise SignInError(502, f"the provider did not answer {url}: {error}", ISSUER_HINT) from None

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            found = await self._get(self.provider.issuer + "/.well-known/openid-configuration")
            missing = [k for k in ENDPOINTS if not isinstance(found.get(k), str)]
            if missing:
                raise SignInError(502, f"the provider's discovery names no {', '.join(missing)}", ISSUER_HINT)
            if str(found.get("issuer", "")).rstrip("/") != self.provider.issuer:
                raise SignInError(
                    502, f"the provider calls itself {found.get('issuer')!r}", "set issuer to it"
                )
            self._metadata = found
        return self._metadata

    async def keys(self, kid: str | None) -> KeySet:
        """The provider's keys, fetched again when ``kid`` is not among those cached."""
        if self._keys is None or (kid is not None and not any(k.kid == kid for k in self._keys.keys)):
            self._keys = KeySet.import_key_set(await self._get((await self.metadata())["jwks_uri"]))  # type: ignore[arg-type]
        return self._keys

    async def login_url(self, redirect_uri: str, state: str, nonce: str, challenge: str) -> str:
        query = {
            "response_type": "code",
            "client_id": self.provider.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(self.provider.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        return f"{(await self.metadata())['authorization_endpoint']}?{urlencode(query)}"

    async def exchange(self, code: str, redirect_uri: str, verifier: str) -> str:
        """The ID token the code is exchanged for."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        secret = client_secret(self.provider)
        auth: tuple[str | bytes, str | bytes] | None = (self.provider.client_id, secret) if secret else None
        if auth is None:
            form["client_id"] = self.provider.client_id
        try:
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
                endpoint = (await self.metadata())["token_endpoint"]
                if auth is None:
                    answer = await client.post(endpoint, data=form)
                else:
                    answer = await client.post(endpoint, data=form, auth=auth)
        except httpx.HTTPError as error:
            raise SignInError(
                502, f"the provider's token endpoint did not answer: {error}", "try again"
            ) from None
        if answer.status_code != 200:
            raise SignInError(401, f"the provider refused the code: {answer.text[:300]}", "sign in again")
        try:
            token = answer.json().get("id_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str):
            raise SignInError(502, "the provider's answer holds no id_token", "add 'openid' to the scopes")
        return token

    async def verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        """The ID token's claims, its signature and claims checked; :class:`SignInError` otherwise."""
        try:
            kid = jws.extract_compact(id_token.encode()).protected.get("kid")
            keys = await self.keys(kid)
            claims: dict[str, Any] = jwt.decode(id_token, keys, algorithms=ALGORITHMS).claims
        except (JoseError, ValueError) as error:
            raise SignInError(401, f"the ID token does not verify: {error}", "sign in again") from None
        problem = claims_problem(claims, self.provider, nonce, time.time())
        if problem:
            raise SignInError(401, problem, "sign in again; if it persists, check oidc.provider")
        return claims


def client_secret(provider: Provider) -> str:
    """The client secret from the control plane's environment or file ("" for a public client)."""
    if provider.client_secret_env:
        value = os.environ.get(provider.client_secret_env, "")
        if not value:
            raise SignInError(
                503, f"{provider.client_secret_env} is not set", "set it where the control plane runs"
            )
        return value
    if provider.client_secret_file:
        try:
            return Path(provider.client_secret_file).read_text().strip()
        except OSError as error:
            raise SignInError(
                503, f"cannot read the client secret: {error}", "check client_secret_file"
            ) from None
    return ""


_parties: dict[str, RelyingParty] = {}
"""The relying party of the provider setting last read, by its JSON text (a change starts afresh)."""


async def relying_party(store: Store) -> RelyingParty:
    value = await store.settings.get(OIDC_SETTING)
    if value is None:
        raise SignInError(404, "no OpenID Connect provider is set", f"set {OIDC_SETTING} (docs/sign-in.md)")
    text = json.dumps(value, sort_keys=True)
    if text not in _parties:
        _parties.clear()
        _parties[text] = RelyingParty(parse_provider(value))
    return _parties[text]


async def sign_in(store: Store, provider: Provider, claims: dict[str, Any]) -> str:
    """The user the claims name, created when missing, with their roles set from their groups: the
    name. :class:`SignInError` when the user may not come in."""
    try:
        name = user_name(claims, provider)
    except ValueError as error:
        raise SignInError(403, str(error), "set username_claim to a claim holding a valid name") from None
    if not await store.users.exists(name):
        if not provider.create_users:
            raise SignInError(403, f"{name} is no llmgw user", "ask an administrator to create the user")
        await store.users.create(name)
        await store.audit.record(name, "user.create", name, {"by": "oidc"})
    wanted = bindings_for(groups_of(claims, provider), provider.groups)
    held = (await store.users.get(name)).bindings
    for binding in held:
        if binding.scope not in {b.scope for b in wanted}:
            await store.users.unbind(name, binding.scope)
    for binding in wanted:
        if binding.scope.kind in (OwnerKind.ORG, OwnerKind.TEAM) and not await store.tenants.exists(
            binding.scope
        ):
            log.warning("the group mapping names %s, which does not exist: not bound", binding.scope)
            continue
        if binding not in held:
            await store.users.bind(name, binding)
    roles = [f"{b.role.label}@{b.scope or CLUSTER}" for b in wanted]
    await store.audit.record(name, "user.sign_in", name, {"roles": roles})
    return name


def _cookie(response: Response, key: str, value: str, max_age: int, *, readable: bool = False) -> None:
    response.set_cookie(
        key, value, max_age=max_age, path="/", secure=True, httponly=not readable, samesite="lax"
    )


def _refusal(error: SignInError) -> JSONResponse:
    return error_response(error.status, error.message, error.hint)


@router.get("/provider")
async def provider_view(state: State) -> dict[str, Any]:
    """Whether sign-in with a provider is offered, and the provider's name, for the sign-in page."""
    value = await state.store.settings.get(OIDC_SETTING)
    if value is None:
        return {"configured": False}
    return {"configured": True, "name": parse_provider(value).name}


def _redirect_uri(request: Request) -> str:
    return str(request.url_for("callback"))


@router.get("/login", response_model=None)
async def login(request: Request, state: State) -> Response:
    """Send the browser to the provider."""
    try:
        party = await relying_party(state.store)
        flow = {"state": random_text(), "nonce": random_text()}
        verifier, challenge = pkce_pair()
        url = await party.login_url(_redirect_uri(request), flow["state"], flow["nonce"], challenge)
    except SignInError as error:
        return _refusal(error)
    response = RedirectResponse(url, status_code=302)
    _cookie(response, FLOW_COOKIE, json.dumps({**flow, "verifier": verifier}), FLOW_S)
    return response


@router.get("/callback", response_model=None)
async def callback(request: Request, state: State) -> Response:
    """The provider sends the browser back here with a code: check it, start a session, go to ``/``."""
    try:
        if "error" in request.query_params:
            raise SignInError(401, f"the provider refused: {request.query_params['error']}", "sign in again")
        try:
            flow = json.loads(request.cookies.get(FLOW_COOKIE, ""))
            verifier, nonce, expected = str(flow["verifier"]), str(flow["nonce"]), str(flow["state"])
        except (ValueError, KeyError, TypeError):
            raise SignInError(
                400, "no sign-in is under way in this browser", "start at /auth/login"
            ) from None
        if request.query_params.get("state") != expected:
            raise SignInError(400, "the state does not match this browser's sign-in", "start at /auth/login")
        code = request.query_params.get("code", "")
        if not code:
            raise SignInError(400, "the provider sent no code", "start at /auth/login")
        party = await relying_party(state.store)
        claims = await party.verify(await party.exchange(code, _redirect_uri(request), verifier), nonce)
        name = await sign_in(state.store, party.provider, claims)
    except SignInError as error:
        return _refusal(error)
    expires = state.store.now() + timedelta(seconds=party.provider.session_s)
    _, secret = await state.store.tokens.create(name, SESSION_TOKEN, expires)
    await state.access_changed()
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(FLOW_COOKIE, path="/")
    _cookie(response, SESSION_COOKIE, secret, int(party.provider.session_s))
    _cookie(response, CSRF_COOKIE, csrf_of(secret), int(party.provider.session_s), readable=True)
    return response


@router.post("/logout", status_code=204, response_model=None)
async def logout(request: Request, state: State) -> Response:
    """End this browser's session (revoke its token) and drop the cookies."""
    secret = request.cookies.get(SESSION_COOKIE, "")
    if secret and not csrf_matches(secret, request.headers.get(CSRF_HEADER, "")):
        return error_response(403, CSRF_REFUSED, CSRF_HINT)
    if secret:
        for token in await state.store.tokens.live():
            if token.name == SESSION_TOKEN and token.secret_hash == _hash(secret):
                await state.store.tokens.revoke(token.id)
        await state.access_changed()
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


def _hash(secret: str) -> str:
    from llmgw.store.keys import hash_secret

    return hash_secret(secret)


ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]


class SessionCookies:
    """Lets an ``/api`` request signed in by the session cookie through as its bearer token, with the
    CSRF header checked on writing calls."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not (scope["path"] == "/api" or scope["path"].startswith("/api/")):
            return await self._app(scope, receive, send)
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        if any(k == b"authorization" for k, _ in headers):
            return await self._app(scope, receive, send)
        secret, given = "", ""
        for key, value in headers:
            if key == b"cookie":
                morsel = SimpleCookie(value.decode("latin-1")).get(SESSION_COOKIE)
                secret = morsel.value if morsel is not None else secret
            elif key == CSRF_HEADER.encode():
                given = value.decode("latin-1")
        if not secret:
            return await self._app(scope, receive, send)
        if scope["method"] in WRITING and not csrf_matches(secret, given):
            return await error_response(403, CSRF_REFUSED, CSRF_HINT)(scope, receive, send)
        headers.append((b"authorization", f"Bearer {secret}".encode("latin-1")))
        await self._app({**scope, "headers": headers}, receive, send)
