"""``/api/mirror/blobs``: what the mirror holds, and uploads into it (kept by sha256).

Any caller reads the listing; an upload needs a member's role somewhere (weights are kept by their
sha256 and only models name them, so who may use them follows the models' owners).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from llmgw.adminapi.schemas import BlobCopyView, BlobImported, BlobView
from llmgw.adminapi.textfields import BLOB_FILENAME, checked_text
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, State, Who
from llmgw.core.tenancy import Role
from llmgw.errors import Forbidden

router = APIRouter(prefix="/api", tags=["mirror"], dependencies=AUTH, responses=declared(401, 503))

MAX_BLOB_BYTES = 256 << 30

BINARY_BODY = {
    "requestBody": {
        "required": True,
        "description": "The file's bytes.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


Filename = Annotated[
    str, Query(min_length=1, max_length=BLOB_FILENAME, description="The file's name, as listings show it.")
]


@router.get("/mirror/blobs", response_model=list[BlobView])
async def list_blobs(state: State) -> list[BlobView]:
    """Every file the mirror holds: sha256, size, name, kind, and the control planes holding it."""
    copies = await state.store.blob_copies.all()
    return [
        BlobView(
            sha256=b.sha256,
            size=b.size,
            filename=b.filename,
            kind=b.kind,
            copies=[
                BlobCopyView(plane=c.plane, address=c.address, copied_at=c.copied_at)
                for c in copies.get(b.sha256, [])
            ],
        )
        for b in await state.store.blobs.list()
    ]


@router.post(
    "/mirror/blobs",
    status_code=201,
    response_model=BlobImported,
    responses=declared(400, 403, 507),
    openapi_extra=BINARY_BODY,
)
async def upload_blob(
    request: Request, state: State, caller: Who, filename: Filename = "model.gguf"
) -> BlobImported:
    """Import the body's bytes as weights, stored as they arrive (507 when the mirror's disk is full);
    the answer's sha256 is what a model definition names. It answers once the copies wanted are on
    their control planes (``mirror.copies``), or once no live peer is left to pull it, saying how many."""
    checked_text("query.filename", filename)
    if (caller.highest() or 0) < Role.MEMBER:
        raise Forbidden(
            f"{caller.name} may not upload into the mirror: that needs a member's role somewhere",
            "ask an administrator for a member's role in a team or organization",
        )
    info = await state.blobs.import_stream(request.stream(), filename, max_bytes=MAX_BLOB_BYTES)
    await state.store.blobs.add(info.sha256, info.size, filename, "weights")
    await state.store.audit.record(caller.name, "mirror.import", info.sha256, {"filename": filename})
    if state.replicator is None:
        return BlobImported(sha256=info.sha256, size=info.size, filename=filename)
    acknowledged = await state.replicator.acknowledge(info.sha256)
    return BlobImported(
        sha256=info.sha256,
        size=info.size,
        filename=filename,
        copies=list(acknowledged.copies),
        wanted=acknowledged.wanted,
        note=acknowledged.note,
    )
