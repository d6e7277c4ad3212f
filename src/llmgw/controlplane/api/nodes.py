"""``/api/nodes``: every node, connected (from the fleet) or known (from the store)."""

from __future__ import annotations

from collections import Counter

import yaml
from fastapi import APIRouter

from llmgw.adminapi.schemas import GpuView, NodeView, RefusedSettingsView
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.mig import device_label
from llmgw.core.nodes import SettingsRefusal, flat_settings

router = APIRouter(
    prefix="/api", tags=["nodes"], dependencies=CLUSTER_ROLE, responses=declared(401, 503, 403)
)


@router.get("/nodes", response_model=list[NodeView])
async def nodes(state: State) -> list[NodeView]:
    """Each node with its address, CPU, memory, GPUs, engines and how many replicas it runs."""
    known = {n.id: n for n in await state.store.nodes.list()}
    placed = Counter(r.node_id for r in state.fleet.replicas.values())  # once, not once a node
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
                    GpuView(
                        index=d.index,
                        label=device_label(d.index),
                        name=d.name,
                        device_class=d.device_class,
                        memory_mb=d.memory_mb,
                    )
                    for d in (inv.gpus if inv else ())
                ],
                engines=list(live.engines) if live else [],
                replicas=placed[node_id],
                refused_settings=refused_view(live.refused_settings) if live else None,
            )
        )
    return out


def refused_view(refusal: SettingsRefusal | None) -> RefusedSettingsView | None:
    """A node's refused settings as the API shows them; None when there are none."""
    if refusal is None:
        return None
    try:
        keys = flat_settings(yaml.safe_load(refusal.settings))
    except yaml.YAMLError:
        keys = refusal.settings
    return RefusedSettingsView(
        settings=refusal.settings, keys=keys, reason=refusal.reason, refused_at=refusal.refused_at
    )


def refusals(fleet: Fleet) -> dict[str, RefusedSettingsView]:
    """Each connected node's refused settings, by node id (nodes without any left out)."""
    out = {}
    for node_id, node in sorted(fleet.nodes.items()):
        view = refused_view(node.refused_settings)
        if view is not None:
            out[node_id] = view
    return out
