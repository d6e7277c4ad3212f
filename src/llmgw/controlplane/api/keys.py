"""``/api/keys``: API keys for ``/v1``. A secret is shown once, when its key is created."""

from __future__ import annotations

from fastapi import APIRouter, Response

from llmgw.controlplane.api.columns import checked_text
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.models import KeyCreated, KeyRequest, KeyView
from llmgw.controlplane.api.state import AUTH, State

router = APIRouter(prefix="/api", tags=["keys"], dependencies=AUTH, responses=declared(401, 503))


@router.get("/keys", response_model=list[KeyView])
async def list_keys(state: State) -> list[KeyView]:
    """Every key, revoked ones included; never a secret."""
    return [
        KeyView(
            id=k.id,
            name=k.name,
            prefix=k.prefix,
            owner=k.owner,
            created_at=k.created_at,
            revoked_at=k.revoked_at,
        )
        for k in await state.store.keys.list(include_revoked=True)
    ]


@router.post("/keys", status_code=201, response_model=KeyCreated, responses=declared(400, 409))
async def create_key(body: KeyRequest, state: State) -> KeyCreated:
    """Create a key; the answer holds its secret, which is never shown again."""
    record, secret = await state.store.keys.create(body.name, body.owner)
    await state.store.audit.record("admin", "key.create", record.id, {"name": body.name})
    await state.on_keys_changed()
    return KeyCreated(id=record.id, name=record.name, key=secret)


@router.delete("/keys/{key}", status_code=204, response_class=Response, responses=declared(400, 404))
async def revoke_key(key: str, state: State) -> Response:
    """Revoke a key (by id or name) at once."""
    checked_text("key", key)
    await state.store.keys.revoke(key)
    await state.store.audit.record("admin", "key.revoke", key)
    await state.on_keys_changed()
    return Response(status_code=204)
