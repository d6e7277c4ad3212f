"""The cluster's summary (``/api/status``), and the probes without a token: healthz, leader, metrics."""

from __future__ import annotations

import socket
import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw import __version__
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.models import ComponentView, ControlPlaneView, Health, LeaderView, StatusView
from llmgw.controlplane.api.nodes import refusals
from llmgw.controlplane.api.state import AUTH, AdminState, State
from llmgw.core.settingtypes import SERVING_STOPPED
from llmgw.store.leases import ControlPlaneRecord

probes = APIRouter(tags=["probes"])
router = APIRouter(prefix="/api", tags=["status"], dependencies=AUTH, responses=declared(401, 503))


@probes.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process answers."""
    return Health()


@probes.get(
    "/leader",
    response_model=LeaderView,
    responses={503: {"model": LeaderView, "description": "This control plane does not lead."}},
)
async def leader(state: State) -> JSONResponse:
    """200 while this control plane leads, 503 otherwise (keepalived's check follows it).

    A leader that cannot reach the store keeps answering 200 ("paused"): it still serves
    from memory, and nobody else can take the lease while the store is away from everyone.
    """
    leadership = state.leadership
    leading = leadership is None or leadership.serving
    body = LeaderView(
        leader=leading,
        name=state.name,
        state=leadership.state if leadership else "leading",
        holder=leadership.holder if leadership else state.name,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if leading else 503)


@probes.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics() -> Response:
    """Prometheus metrics of this process."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/status", response_model=StatusView)
async def status(state: State) -> StatusView:
    """Which control plane leads, which stand by, counts, what cannot be placed, supervised components."""
    models = await state.store.models.list()
    replicas = list(state.fleet.replicas.values())
    stopped = await state.store.settings.get(SERVING_STOPPED, False) is True
    leader = state.leadership.holder if state.leadership else state.name
    return StatusView(
        name=state.name,
        version=__version__,
        leader=leader,
        standbys=[p.name for p in _planes(state) if p.name != leader],
        control_planes=[
            ControlPlaneView(
                name=p.name,
                role="leader" if p.name == leader else "standby",
                http=p.http_address,
                agents=p.agent_address,
                seen_ago_s=round(p.seen_ago_s, 1),
            )
            for p in _planes(state)
        ],
        vip=state.vip,
        vip_on_leader=bool(state.vip) and address_is_local(state.vip),
        stopped=stopped,
        uptime_s=int(time.time() - state.started),
        nodes=len(state.fleet.nodes),
        models=len(models),
        replicas=len(replicas),
        replicas_ready=sum(1 for r in replicas if r.state == "ready"),
        reconcile_error=state.reconciler.last_error,
        unplaced=dict(state.reconciler.unplaced),
        components=[
            ComponentView(
                name=c.name,
                state=c.state,
                restarts=c.restarts,
                last_error=c.last_error,
                last_error_at=c.last_error_at,
            )
            for c in state.components()
        ],
        refused_settings=refusals(state.fleet),
    )


def _planes(state: AdminState) -> list[ControlPlaneRecord]:
    return state.leadership.control_planes if state.leadership else []


def address_is_local(address: str) -> bool:
    """Whether ``address`` is on one of this machine's interfaces (a floating address held here)."""
    host = address.split("/")[0]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True
