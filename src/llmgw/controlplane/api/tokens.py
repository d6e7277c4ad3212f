"""``/api/users/{user}/tokens`` and ``/api/tokens``: users' own tokens for ``/api`` and ``llmgw ctl``.

A user creates, lists and revokes their own tokens; a cluster admin does so
for anyone. A token's secret is shown once; it works until it expires or is
revoked (at once: the control plane reloads the live tokens on the change).
"""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Response

from llmgw.adminapi.tenancy import Name, TokenCreated, TokenRequest, TokenView
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, State, Who
from llmgw.core.tenancy import CLUSTER, Action
from llmgw.errors import NotFound
from llmgw.store.usertokens import TokenRecord

router = APIRouter(prefix="/api", tags=["tokens"], dependencies=AUTH, responses=declared(401, 403, 503))


def _view(t: TokenRecord) -> TokenView:
    return TokenView(
        id=t.id,
        user=t.user,
        name=t.name,
        prefix=t.prefix,
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked_at=t.revoked_at,
    )


def _check(caller: Caller, user: str) -> None:
    if caller.name != user:
        caller.check(Action.OPERATE, CLUSTER)


@router.get("/users/{name}/tokens", response_model=list[TokenView], responses=declared(400))
async def list_tokens(name: Name, state: State, caller: Who) -> list[TokenView]:
    """The user's tokens, revoked and expired ones included; never a secret."""
    _check(caller, name)
    return [_view(t) for t in await state.store.tokens.list(name)]


@router.post(
    "/users/{name}/tokens", status_code=201, response_model=TokenCreated, responses=declared(400, 404)
)
async def create_token(name: Name, body: TokenRequest, state: State, caller: Who) -> TokenCreated:
    """A new token of the user; the answer holds its secret, which is never shown again."""
    _check(caller, name)
    expires = None if body.expires_in_s is None else state.store.now() + timedelta(seconds=body.expires_in_s)
    record, secret = await state.store.tokens.create(name, body.name, expires)
    await state.store.audit.record(caller.name, "token.create", record.id, {"user": name, "name": body.name})
    await state.access_changed()
    return TokenCreated(id=record.id, user=name, name=record.name, token=secret, expires_at=record.expires_at)


@router.delete("/tokens/{token_id}", status_code=204, response_class=Response, responses=declared(400, 404))
async def revoke_token(token_id: Name, state: State, caller: Who) -> Response:
    """Revoke a token at once."""
    record = await state.store.tokens.get(token_id)
    if caller.name != record.user and not caller.may(Action.OPERATE, CLUSTER):
        raise NotFound(f"no token has the id {token_id!r}", "'llmgw ctl user token list USER' lists them")
    await state.store.tokens.revoke(token_id)
    await state.store.audit.record(caller.name, "token.revoke", token_id, {"user": record.user})
    await state.access_changed()
    return Response(status_code=204)
