"""``/api/agents/restart``: every connected agent restarts over its stream; engines keep serving (C2.6)."""

from __future__ import annotations

import logging

from fastapi import APIRouter

from llmgw.adminapi.schemas import RestartAnswer, RestartRequest
from llmgw.adminapi.textfields import AUDIT_TARGET
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State, Who
from llmgw.core.nodes import RestartAgent
from llmgw.errors import ChannelClosed

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/api", tags=["agents"], dependencies=CLUSTER_ROLE, responses=declared(400, 401, 503, 403)
)


@router.post("/agents/restart", response_model=RestartAnswer)
async def restart_agents(body: RestartRequest, state: State, caller: Who) -> RestartAnswer:
    """Send RestartAgent to every connected agent; the answer names the nodes asked."""
    sent = []
    for node_id, node in sorted(state.fleet.nodes.items()):
        try:
            await node.channel.send(RestartAgent(reason=body.reason))
        except ChannelClosed as error:
            log.warning("could not ask node %s to restart: %s", node_id, error)
            continue
        sent.append(node_id)
    target = ",".join(sent)
    if len(target) > AUDIT_TARGET:
        target = f"{len(sent)} nodes"
    await state.store.audit.record(
        caller.name, "agents.restart", target, {"reason": body.reason, "nodes": sent}
    )
    return RestartAnswer(restarted=sent)
