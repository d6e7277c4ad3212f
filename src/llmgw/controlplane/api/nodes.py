"""``/api/nodes``: every node, connected (from the fleet) or known (from the store)."""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.models import GpuView, NodeView
from llmgw.controlplane.api.state import AUTH, State

router = APIRouter(prefix="/api", tags=["nodes"], dependencies=AUTH, responses=declared(401, 503))


@router.get("/nodes", response_model=list[NodeView])
async def nodes(state: State) -> list[NodeView]:
    """Each node with its address, CPU, memory, GPUs, engines and how many replicas it runs."""
    known = {n.id: n for n in await state.store.nodes.list()}
    out = []
    for node_id in sorted(set(known) | set(state.fleet.nodes)):
        live = state.fleet.nodes.get(node_id)
        inv = live.inventory if live else None
        record = known.get(node_id)
        out.append(
            NodeView(
                id=node_id,
                connected=live is not None,
                address=inv.address if inv else (record.address if record else ""),
                cpu_cores=inv.cpu_cores if inv else 0,
                memory_mb=inv.memory_mb if inv else 0,
                gpus=[
                    GpuView(index=d.index, name=d.name, device_class=d.device_class, memory_mb=d.memory_mb)
                    for d in (inv.gpus if inv else ())
                ],
                engines=list(live.engines) if live else [],
                replicas=sum(1 for r in state.fleet.replicas.values() if r.node_id == node_id),
            )
        )
    return out
