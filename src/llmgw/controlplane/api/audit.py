"""``/api/audit``: who changed what, newest first."""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.schemas import AuditEntry
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State

router = APIRouter(
    prefix="/api", tags=["audit"], dependencies=CLUSTER_ROLE, responses=declared(400, 401, 503, 403)
)


@router.get("/audit", response_model=list[AuditEntry])
async def audit(state: State, limit: int = 100) -> list[AuditEntry]:
    """The last ``limit`` changes: when, who, what, on what, with which details."""
    return [
        AuditEntry(at=a.at, actor=a.actor, action=a.action, target=a.target, detail=a.detail)
        for a in await state.store.audit.list(max(0, min(limit, 10_000)))
    ]
