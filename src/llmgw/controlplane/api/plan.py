"""``/api/plan``: where one more replica of each model would go now, and why every other node was not.

The answer is placement's own decision (:meth:`Reconciler.decide`, the call a
reconcile pass acts on) over the connected nodes and the replicas placed in the
store: the node, cards and profile chosen, and each other node's reason, naming
the cards it looked at; for a model that fits nowhere, the lower-priority
replicas that would be evicted for it and why every other one is kept.
``llmgw ctl plan``, the console and the portal show it.
"""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.schemas import PlanRefusal, PlanView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State
from llmgw.controlplane.replicas.multinode import rank_of
from llmgw.core.catalog import parse_model
from llmgw.core.mig import device_label
from llmgw.core.providers import served_outside
from llmgw.errors import LlmgwError, NotFound

router = APIRouter(prefix="/api", tags=["plan"], dependencies=CLUSTER_ROLE, responses=declared(401, 503, 403))

NO_NODE = "no node is connected"


@router.get("/plan", response_model=list[PlanView], responses=declared(400, 404))
async def plan(state: State, model: str | None = None) -> list[PlanView]:
    """Each model (or ``model`` alone): the node and cards one more replica would take now, and
    why every other connected node was turned down."""
    if model is not None:
        checked_text("query.model", model)
    records = await state.store.models.list()
    if model is not None:
        records = [r for r in records if r.name == model]
        if not records:
            raise NotFound(f"model {model!r} is not in the catalog", "llmgw ctl models lists the catalog")
    placed = await state.store.replicas.list()
    out = []
    for record in records:
        mine = sum(1 for r in placed if r.model == record.name and rank_of(r.id)[1] == 0)  # heads only
        try:
            definition = parse_model(record.definition)
        except LlmgwError as error:
            out.append(
                PlanView(
                    model=record.name, node="", devices=[], memory_mb=0, replicas=mine, wanted=0,
                    refused=[], problem=f"the stored definition does not read: {error}",
                )
            )  # fmt: skip
            continue
        if definition.provider is not None:
            out.append(
                PlanView(
                    model=record.name, node="", devices=[], memory_mb=0, replicas=0, wanted=0, refused=[],
                    problem=f"served outside the cluster ({served_outside(definition)}): nothing to place",
                )
            )  # fmt: skip
            continue
        decision = state.reconciler.decide(definition, placed)
        if not decision.placed and state.fleet.nodes:
            decision = state.reconciler.decide(definition, placed, unplaced=decision)
        profile = definition.profiles[decision.profile]
        out.append(
            PlanView(
                model=record.name,
                node=decision.node_id,
                devices=list(decision.devices),
                device_labels=[device_label(d) for d in decision.devices],
                memory_mb=definition.memory_needed_mb(profile),
                replicas=mine,
                wanted=0 if state.reconciler.stopped else definition.replicas.min,
                refused=[PlanRefusal(node=n, reason=why) for n, why in sorted(decision.refusals.items())],
                problem="" if state.fleet.nodes else NO_NODE,
                profile=decision.profile + 1 if decision.placed or decision.evict_node else 0,
                priority=definition.priority,
                evict_node=decision.evict_node,
                evict=list(decision.evict),
                waiting_for=list(decision.waiting_for),
                kept=[PlanRefusal(node=r, reason=why) for r, why in sorted(decision.kept.items())],
                scaling=state.reconciler.scaling.get(record.name, ""),
                more_nodes=[shard.node_id for shard in decision.more],
            )
        )
    return out
