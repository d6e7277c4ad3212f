"""``/api/keys``: API keys for ``/v1``. A secret is shown once, when its key is created.

A key sits in a project or with a user (its ``place``): it sees public models
and those owned at or above it. Creating or revoking one needs a member over
its place (a user over their own keys); a key sitting nowhere (public
models only) is a cluster admin's. Keys the caller cannot read are absent
from the listing and answer 404.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from llmgw.adminapi.schemas import KeyCreated, KeyRequest, KeyView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, State, Who
from llmgw.core.tenancy import Action, Owner, OwnerKind
from llmgw.errors import NotFound, ValidationFailed
from llmgw.store.keys import KeyRecord

router = APIRouter(prefix="/api", tags=["keys"], dependencies=AUTH, responses=declared(401, 403, 503))


def _view(k: KeyRecord) -> KeyView:
    return KeyView(
        id=k.id,
        name=k.name,
        prefix=k.prefix,
        owner=k.owner,
        created_at=k.created_at,
        revoked_at=k.revoked_at,
        place=str(k.place),
        collections=list(k.collections),
    )


@router.get("/keys", response_model=list[KeyView])
async def list_keys(state: State, caller: Who) -> list[KeyView]:
    """Every key the caller may read, revoked ones included; never a secret."""
    return [
        _view(k)
        for k in await state.store.keys.list(include_revoked=True)
        if caller.may(Action.READ, k.place)
    ]


@router.post("/keys", status_code=201, response_model=KeyCreated, responses=declared(400, 404, 409))
async def create_key(body: KeyRequest, state: State, caller: Who) -> KeyCreated:
    """Create a key in a project or for a user; the answer holds its secret, which is never shown again."""
    place = Owner.parse(body.place)
    if place.kind not in (OwnerKind.CLUSTER, OwnerKind.PROJECT, OwnerKind.USER):
        raise ValidationFailed(
            [("place", f"a key sits in a project or with a user, not at {place}")],
            "give place: project:ORG/TEAM/PROJECT or user:NAME",
        )
    caller.check(Action.WRITE if not place.public else Action.OPERATE, place)
    if place.kind is OwnerKind.USER:
        await state.store.users.get(place.path)
    elif not await state.store.tenants.exists(place):
        raise NotFound(f"{place} does not exist", "'llmgw ctl project list' lists the projects")
    record, secret = await state.store.keys.create(body.name, body.owner, place, body.collections)
    await state.store.audit.record(
        caller.name, "key.create", record.id, {"name": body.name, "place": str(place)}
    )
    await state.access_changed()
    state.changes.changed("keys")
    return KeyCreated(id=record.id, name=record.name, key=secret)


@router.delete("/keys/{key}", status_code=204, response_class=Response, responses=declared(400, 404))
async def revoke_key(key: str, state: State, caller: Who) -> Response:
    """Revoke a key (by id or name) at once."""
    checked_text("key", key)
    record = await state.store.keys.find(key)
    if not caller.may(Action.READ, record.place):
        raise NotFound(f"no active API key has the id or name {key!r}", "'llmgw ctl key list' lists the keys")
    caller.check(Action.WRITE if not record.place.public else Action.OPERATE, record.place)
    await state.store.keys.revoke(record.id)
    await state.store.audit.record(caller.name, "key.revoke", record.id)
    await state.access_changed()
    state.changes.changed("keys")
    return Response(status_code=204)
