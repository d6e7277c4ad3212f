"""``/api/mirror/blobs``: what the mirror holds, uploads into it (kept by sha256), and removals.

Any caller reads the listing; an upload needs a member's role somewhere (weights are kept by their
sha256 and only models name them, so who may use them follows the models' owners). An upload is
recorded as its user's, counted against the user's quota (server.yaml ``mirror.quota_bytes``, or a
``mirror.quotas`` entry; a cluster admin has none): one that would pass it, or ``mirror.max_upload_bytes``,
is refused 413 before its bytes are taken (by its ``Content-Length``; a body sent without one is cut
where it passes). The uploader or a cluster admin removes a blob (``DELETE``) while nothing names it
(409 says what does: :mod:`~llmgw.controlplane.mirror.blobuses`); every control plane's replicator
then removes its copy.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from llmgw.adminapi.schemas import BlobCopyView, BlobImported, BlobRemoved, BlobView, MirrorQuotaView
from llmgw.adminapi.textfields import BLOB_FILENAME
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.controlplane.mirror.blobuses import blob_uses
from llmgw.core.filenames import filename_problem
from llmgw.core.tenancy import CLUSTER, Role
from llmgw.errors import Conflict, Forbidden, TooLarge, ValidationFailed
from llmgw.mirror.builds import BuildIndex
from llmgw.store.blobs import checked_sha256

router = APIRouter(prefix="/api", tags=["mirror"], dependencies=AUTH, responses=declared(401, 503))

BINARY_BODY = {
    "requestBody": {
        "required": True,
        "description": "The file's bytes.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}

FREE_ROOM = (
    "remove blobs you no longer need ('llmgw ctl mirror rm SHA256'; 'llmgw ctl mirror ls' lists yours)"
)


Filename = Annotated[
    str, Query(min_length=1, max_length=BLOB_FILENAME, description="The file's name, as listings show it.")
]
Digest = Annotated[str, Path(description="The blob's sha256 (64 hex digits, optionally 'sha256:' first).")]


def quota_of(state: AdminState, caller: Caller) -> int | None:
    """The bytes ``caller`` may hold in the mirror; None: no bound (a cluster admin)."""
    if caller.role_over(CLUSTER) == Role.CLUSTER_ADMIN:
        return None
    return state.mirror.quota_of(caller.name)


async def check_room(state: AdminState, caller: Caller) -> None:
    """TooLarge (413) when ``caller`` has used up its quota: a pull, whose size is known only as it
    goes, starts only with room left (what it brings is counted as the caller's after)."""
    quota = quota_of(state, caller)
    if quota is None:
        return
    used = await state.store.blobs.bytes_of(caller.name)
    if used >= quota:
        raise _over_quota(caller.name, used, None, quota)


@router.get("/mirror/blobs", response_model=list[BlobView])
async def list_blobs(state: State) -> list[BlobView]:
    """Every file the mirror holds: sha256, size, name, kind, owner, and the control planes holding it."""
    copies = await state.store.blob_copies.all()
    return [
        BlobView(
            sha256=b.sha256,
            size=b.size,
            filename=b.filename,
            kind=b.kind,
            owner=b.owner,
            copies=[
                BlobCopyView(plane=c.plane, address=c.address, copied_at=c.copied_at)
                for c in copies.get(b.sha256, [])
            ],
        )
        for b in await state.store.blobs.list()
    ]


@router.get("/mirror/quota", response_model=MirrorQuotaView)
async def mirror_quota(state: State, caller: Who) -> MirrorQuotaView:
    """The caller's use of the mirror against its quota, and the largest upload taken."""
    return MirrorQuotaView(
        user=caller.name,
        used_bytes=await state.store.blobs.bytes_of(caller.name),
        quota_bytes=quota_of(state, caller),
        max_upload_bytes=state.mirror.max_upload_bytes,
    )


def _declared_size(request: Request) -> int | None:
    try:
        return int(request.headers["content-length"])
    except (KeyError, ValueError):
        return None


@router.post(
    "/mirror/blobs",
    status_code=201,
    response_model=BlobImported,
    responses=declared(400, 403, 413, 507),
    openapi_extra=BINARY_BODY,
)
async def upload_blob(
    request: Request, state: State, caller: Who, filename: Filename = "model.gguf"
) -> BlobImported:
    """Import the body's bytes as weights, stored as they arrive (507 when the mirror's disk is full;
    413 past ``mirror.max_upload_bytes`` or the caller's quota); the answer's sha256 is what a model
    definition names. It answers once the copies wanted are on their control planes (``mirror.copies``),
    or once no live peer is left to pull it, saying how many."""
    problem = filename_problem(filename)
    if problem:
        raise ValidationFailed(
            [("query.filename", problem)], "give the file's name alone, such as model.gguf"
        )
    if (caller.highest() or 0) < Role.MEMBER:
        raise Forbidden(
            f"{caller.name} may not upload into the mirror: that needs a member's role somewhere",
            "ask an administrator for a member's role in a team or organization",
        )
    limit = state.mirror.max_upload_bytes
    quota = quota_of(state, caller)
    used = await state.store.blobs.bytes_of(caller.name)
    declared_size = _declared_size(request)
    if declared_size is not None and declared_size > limit:
        raise _too_large(declared_size, limit)
    if quota is not None:
        if used + (declared_size or 1) > quota:
            raise _over_quota(caller.name, used, declared_size, quota)
        limit = min(limit, quota - used)
    try:
        info = await state.blobs.import_stream(request.stream(), filename, max_bytes=limit)
    except ValidationFailed as error:  # the body passed the limit as it came
        if quota is not None and limit < state.mirror.max_upload_bytes:
            raise _over_quota(caller.name, used, None, quota) from error
        raise _too_large(None, limit) from error
    recorded = await state.store.blobs.add(info.sha256, info.size, filename, "weights", owner=caller.name)
    await state.store.audit.record(
        caller.name, "mirror.import", info.sha256, {"filename": filename, "owner": recorded.owner}
    )
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


def _too_large(size: int | None, limit: int) -> TooLarge:
    sent = f"the upload of {size} bytes" if size is not None else "the upload"
    return TooLarge(
        f"{sent} passes the mirror's limit of {limit} bytes for one upload (mirror.max_upload_bytes); "
        "nothing of it was kept",
        "import files this large on the control plane itself with 'llmgw mirror import', "
        "or ask an administrator to raise mirror.max_upload_bytes in server.yaml",
    )


def _over_quota(user: str, used: int, size: int | None, quota: int) -> TooLarge:
    this = f"this upload's {size} bytes" if size is not None else "this upload"
    return TooLarge(
        f"{user} holds {used} bytes in the mirror and {this} would pass the quota of {quota} bytes "
        "(mirror.quota_bytes); nothing of it was kept",
        f"{FREE_ROOM}, or ask an administrator for a larger quota (mirror.quotas in server.yaml)",
    )


@router.delete("/mirror/blobs/{sha256}", response_model=BlobRemoved, responses=declared(400, 403, 404, 409))
async def remove_blob(sha256: Digest, state: State, caller: Who) -> BlobRemoved:
    """Remove a blob from the mirror: its uploader or a cluster admin, while no model, adapter, engine
    build, training job or client file names it (409 says which do). Every control plane's replicator
    removes its copy at its next pass (``mirror.interval_s``)."""
    digest = checked_sha256(sha256.strip())
    record = await state.store.blobs.get(digest)
    if caller.role_over(CLUSTER) != Role.CLUSTER_ADMIN and (not record.owner or record.owner != caller.name):
        whose = f"{record.owner}'s" if record.owner else "the cluster's"
        raise Forbidden(
            f"{caller.name} may not remove blob {digest[:12]}… ({record.filename}): it is {whose}",
            "its uploader or a cluster admin removes it",
        )
    uses = await blob_uses(state.store, BuildIndex(state.blobs.root), digest)
    if uses:
        raise Conflict(
            f"blob {digest[:12]}… ({record.filename}) is in use by {', '.join(uses)}: it was not removed",
            "remove those first, or change them to name other files, then remove the blob again",
        )
    await state.store.blobs.remove(digest)
    await state.store.audit.record(
        caller.name,
        "mirror.remove",
        digest,
        {"filename": record.filename, "size": record.size, "owner": record.owner},
    )
    return BlobRemoved(
        sha256=digest,
        size=record.size,
        filename=record.filename,
        owner=record.owner,
        note="each control plane removes its copy within mirror.interval_s",
    )
