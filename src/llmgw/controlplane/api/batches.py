"""``/api/batches``: the batches clients made on ``/v1/batches``, as operators follow them.

An operator sees the batches of the places they see (the admin token: all),
with their progress, and may cancel one they may write; the leader then
finishes what is in flight and answers the rest ``batch_cancelled``.
"""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.batches import BatchView
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.batches import BatchStatus
from llmgw.core.tenancy import Action, Owner
from llmgw.errors import Conflict, NotFound
from llmgw.store.batches import BatchRecord

router = APIRouter(
    prefix="/api/batches", tags=["batches"], dependencies=AUTH, responses=declared(401, 403, 503)
)

LISTED = 1000
"""Most batches one list answers, newest first."""


def batch_view(record: BatchRecord) -> BatchView:
    return BatchView(
        id=record.id,
        owner=record.owner,
        key_id=record.key_id,
        endpoint=record.endpoint,
        status=record.status.value,
        total=record.total,
        completed=record.completed,
        failed=record.failed,
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        input_file_id=record.input_file_id,
        output_file_id=record.output_file_id,
        error_file_id=record.error_file_id,
        errors=record.errors,
        created_at=record.created_at,
        expires_at=record.expires_at,
        times=record.times,
    )


async def _seen(state: AdminState, caller: Caller, batch_id: str) -> BatchRecord:
    try:
        record = await state.store.batches.get(batch_id)
    except NotFound:
        record = None
    if record is None or not caller.sees(Owner.parse(record.owner)):
        raise NotFound(f"no batch {batch_id!r}", "'llmgw ctl batch list' lists the batches you see")
    return record


@router.get("", response_model=list[BatchView])
async def list_batches(state: State, caller: Who, unended: bool = False) -> list[BatchView]:
    """The batches the caller sees, newest first (``unended``: only those still running)."""
    records = await state.store.batches.unended() if unended else await state.store.batches.every(LISTED)
    return [batch_view(r) for r in records if caller.sees(Owner.parse(r.owner))]


@router.get("/{batch_id}", response_model=BatchView, responses=declared(404))
async def get_batch(batch_id: str, state: State, caller: Who) -> BatchView:
    """One batch: status, requests answered and failed of how many, tokens, files."""
    return batch_view(await _seen(state, caller, batch_id))


@router.post("/{batch_id}/cancel", response_model=BatchView, responses=declared(404, 409))
async def cancel_batch(batch_id: str, state: State, caller: Who) -> BatchView:
    """Stop a batch: what is in flight finishes, the rest is answered ``batch_cancelled``."""
    record = await _seen(state, caller, batch_id)
    caller.check(Action.WRITE, Owner.parse(record.owner))
    if record.status.ended or record.status is BatchStatus.CANCELLING:
        return batch_view(record)
    if record.status is BatchStatus.FINALIZING:
        raise Conflict(
            f"batch {batch_id} is finalizing: every request was answered", "nothing is left to cancel"
        )
    moved = await state.store.batches.move(batch_id, BatchStatus.CANCELLING)
    await state.store.audit.record(caller.name, "batch.cancel", batch_id, {"owner": record.owner})
    return batch_view(moved)
