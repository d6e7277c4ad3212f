"""``/api/cluster/restart`` (``llmgw restart``): every agent, the other control planes, then this one;
``/api/control-plane/restart``: this control plane alone, never relayed (C10.1)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request

from llmgw.adminapi.schemas import (
    ClusterRestartAnswer,
    RestartedView,
    RestartRequest,
    SelfRestartAnswer,
)
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State, Who
from llmgw.controlplane.lifecycle.clusterrestart import ClusterRestart, HttpPeers
from llmgw.controlplane.lifecycle.selfrestart import INSTANCE
from llmgw.errors import ValidationFailed
from llmgw.store.leases import Leases

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/api", tags=["restart"], dependencies=CLUSTER_ROLE, responses=declared(400, 401, 503, 403)
)

RELAYED_PORT = 0
"""A request a standby relayed reaches the app from port 0 (``asgi_calls``): a real client never does."""


@router.post("/cluster/restart", response_model=ClusterRestartAnswer)
async def restart_cluster(
    body: RestartRequest, request: Request, state: State, caller: Who
) -> ClusterRestartAnswer:
    """Restart every agent, then every other control plane, each waited for; this one starts again
    once the answer is sent. Send it to the leader's own address."""
    if request.client is not None and request.client.port == RELAYED_PORT:
        leader = state.leadership.leader if state.leadership else None
        where = leader.http_address if leader else "the leader"
        raise ValidationFailed(
            [("", "a cluster restart must go to the leader itself: the standby relaying it restarts too")],
            f"send it to {where} ('llmgw restart' finds the leader)",
        )
    lease_s = state.leadership.lease_s if state.leadership else 10.0
    await state.store.audit.record(caller.name, "cluster.restart", state.name, {"reason": body.reason})
    restart = ClusterRestart(
        state.fleet, state.name, Leases(state.store).control_planes, HttpPeers(), lease_s=lease_s
    )
    done = await restart.run(body.reason, request.headers.get("authorization", ""))
    # this process last: the answer goes out first (the HTTP server finishes requests in flight)
    asyncio.get_running_loop().call_later(0.1, state.self_restart.request, body.reason)
    return ClusterRestartAnswer(
        restarted=[RestartedView(kind=r.kind, name=r.name, seconds=round(r.seconds, 2)) for r in done],
        then=state.name,
    )


@router.post("/control-plane/restart", response_model=SelfRestartAnswer, status_code=202)
async def restart_control_plane(body: RestartRequest, state: State, caller: Who) -> SelfRestartAnswer:
    """This control plane stops cleanly (handing leadership off if it leads) and starts again."""
    log.info("%s asked control plane %s to restart: %s", caller.name, state.name, body.reason)
    asyncio.get_running_loop().call_later(0.1, state.self_restart.request, body.reason)
    return SelfRestartAnswer(name=state.name, instance=INSTANCE)
