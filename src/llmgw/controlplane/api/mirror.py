"""``/api/mirror/blobs``: what the mirror holds, and uploads into it (kept by sha256)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fastapi import APIRouter, Request

from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.models import BlobImported, BlobView
from llmgw.controlplane.api.state import AUTH, State
from llmgw.errors import ValidationFailed

router = APIRouter(prefix="/api", tags=["mirror"], dependencies=AUTH, responses=declared(401, 503))

MAX_BLOB_BYTES = 256 << 30

BINARY_BODY = {
    "requestBody": {
        "required": True,
        "description": "The file's bytes.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.get("/mirror/blobs", response_model=list[BlobView])
async def list_blobs(state: State) -> list[BlobView]:
    """Every file the mirror holds: sha256, size, name, kind."""
    return [
        BlobView(sha256=b.sha256, size=b.size, filename=b.filename, kind=b.kind)
        for b in await state.store.blobs.list()
    ]


@router.post(
    "/mirror/blobs",
    status_code=201,
    response_model=BlobImported,
    responses=declared(400),
    openapi_extra=BINARY_BODY,
)
async def upload_blob(request: Request, state: State, filename: str = "model.gguf") -> BlobImported:
    """Import the body's bytes as weights; the answer's sha256 is what a model definition names."""
    state.blobs.root.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=state.blobs.root, prefix=".upload-", delete=True) as handle:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BLOB_BYTES:
                raise ValidationFailed([("body", "larger than 256 GiB")], "split the upload")
            handle.write(chunk)
        handle.flush()
        info = await state.blobs.import_file(Path(handle.name))
    await state.store.blobs.add(info.sha256, info.size, filename, "weights")
    await state.store.audit.record("admin", "mirror.import", info.sha256, {"filename": filename})
    return BlobImported(sha256=info.sha256, size=info.size, filename=filename)
