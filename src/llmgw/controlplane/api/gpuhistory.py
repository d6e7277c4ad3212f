"""``/api/gpu-history``: each card's recent readings, from the telemetry the leader keeps (an hour).

The portal's node page charts these; its GPU map asks for the last point
only (``points=1``). Prometheus (``/metrics``) keeps the long history.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from llmgw.adminapi.schemas import AnswerModel
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State
from llmgw.controlplane.nodes.gpu_history import POINTS_PER_CARD, CardHistory

router = APIRouter(
    prefix="/api", tags=["nodes"], dependencies=CLUSTER_ROLE, responses=declared(400, 401, 503, 403)
)


class CardPointView(AnswerModel):
    """One reading; null where the device gives no value (utilisation of a MIG instance)."""

    at_ms: int
    memory_used_mb: int
    memory_total_mb: int
    utilization_percent: int | None
    memory_bandwidth_percent: int | None
    temperature_c: int | None
    power_w: float | None
    sm_clock_mhz: int | None


class CardHistoryView(AnswerModel):
    """One device of a node and its readings, oldest first."""

    node: str
    device: int
    label: str
    """``3`` for a card, ``0/mig2`` for a MIG instance."""
    device_class: str
    points: list[CardPointView]


def card_view(card: CardHistory, points: int) -> CardHistoryView:
    kept = list(card.points)[-points:]
    return CardHistoryView(
        node=card.node,
        device=card.device,
        label=card.label,
        device_class=card.device_class,
        points=[CardPointView.model_validate(p, from_attributes=True) for p in kept],
    )


@router.get("/gpu-history", response_model=list[CardHistoryView])
async def gpu_history(
    state: State,
    node: Annotated[str | None, Query(description="Only this node's devices.")] = None,
    points: Annotated[
        int, Query(ge=1, le=POINTS_PER_CARD, description="The most recent readings per device.")
    ] = POINTS_PER_CARD,
) -> list[CardHistoryView]:
    """Every device's recent readings (10 s apart, the last hour at most), by node and device."""
    return [card_view(card, points) for card in state.gpu_history.cards(node)]
