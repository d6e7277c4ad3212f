"""``/api/serving``: ``llmgw stop`` and ``llmgw start`` for the whole cluster (C5.4)."""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.schemas import ServingRequest, ServingView
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State, Who
from llmgw.core.settingtypes import SERVING_STOPPED

router = APIRouter(
    prefix="/api", tags=["serving"], dependencies=CLUSTER_ROLE, responses=declared(400, 401, 503, 403)
)


@router.put("/serving", response_model=ServingView)
async def serving(body: ServingRequest, state: State, caller: Who) -> ServingView:
    """``llmgw stop`` (stopped: true): every model to no replicas, /v1 POSTs answer 503;
    ``llmgw start`` (stopped: false) serves again. No model definition changes."""
    await state.store.settings.set(SERVING_STOPPED, body.stopped, caller.name)
    await state.store.audit.record(
        caller.name, "serving.stop" if body.stopped else "serving.start", "serving"
    )
    state.reconciler.stopped = body.stopped
    state.changes.changed("serving")
    state.reconciler.wake()
    return ServingView(stopped=body.stopped)
