"""``/api/presets``: the ready model definitions (:mod:`llmgw.core.presets`) a caller may add by name."""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.schemas import PresetView
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH
from llmgw.core.presets import PRESETS

router = APIRouter(prefix="/api", tags=["models"], dependencies=AUTH, responses=declared(401, 503))


@router.get("/presets", response_model=list[PresetView])
async def presets() -> list[PresetView]:
    """Every preset: its name, what it is, what it needs and the definition it adds."""
    return [
        PresetView(
            name=p.name,
            description=p.description,
            needs=p.needs,
            definition=p.definition(sha256="", size=0),
        )
        for p in sorted(PRESETS.values(), key=lambda p: p.name)
    ]
