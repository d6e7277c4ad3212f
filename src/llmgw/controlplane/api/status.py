"""The cluster's summary (``/api/status``), the probes without a token (healthz, leader), and
``/metrics``, which wants a token that may read the cluster
(:mod:`~llmgw.controlplane.admin.metricsaccess`).

The floating address (C1.9) is known cluster-wide (:data:`VIP_SETTING`, which a
control plane started with ``--vip`` records when it leads); the status says it
is on the leader when the leader, which answers ``/api/status`` on every control
plane (a standby relays it), finds it assigned to one of its own interfaces.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw import __version__
from llmgw.adminapi.schemas import (
    ComponentView,
    ControlPlaneView,
    Health,
    LeaderView,
    ProviderView,
    QueueView,
    StatusView,
)
from llmgw.controlplane.admin.metricsaccess import metrics_refusal
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.nodes import refusals
from llmgw.controlplane.api.state import AUTH, AdminState, State
from llmgw.controlplane.lifecycle.selfrestart import INSTANCE
from llmgw.core.catalog import ModelDefinition
from llmgw.core.providers import served_outside
from llmgw.core.settingtypes import SERVING_STOPPED, VIP_SETTING
from llmgw.errors import Forbidden, Unauthorized
from llmgw.store.leases import ControlPlaneRecord

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IP_TIMEOUT_S = 5.0
"""How long ``ip -j addr show`` may take."""

probes = APIRouter(tags=["probes"])
router = APIRouter(prefix="/api", tags=["status"], dependencies=AUTH, responses=declared(401, 503))


@probes.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process answers, with this start of it (a new instance after a restart)."""
    return Health(instance=INSTANCE)


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


@probes.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **declared(401, 403)},
)
async def metrics(request: Request, state: State) -> Response:
    """Prometheus metrics of this process: for the admin token or a viewer at the cluster."""
    refusal = metrics_refusal(state.who, request.headers.get("authorization", ""))
    if refusal is not None:
        error = Unauthorized if refusal.status == 401 else Forbidden
        raise error(refusal.message, refusal.hint)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/status", response_model=StatusView)
async def status(state: State) -> StatusView:
    """Which control plane leads, which stand by, counts, what cannot be placed, supervised components."""
    models = await state.store.models.list()
    replicas = list(state.fleet.replicas.values())
    stopped = await state.store.settings.get(SERVING_STOPPED, False) is True
    leader = state.leadership.holder if state.leadership else state.name
    vip = await vip_of(state)
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
        vip=vip,
        vip_on_leader=bool(vip) and leader == state.name and await address_assigned(vip),
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
        providers=await provider_views(state),
        queues={
            model: QueueView(waiting=q.waiting, by_flow=q.by_flow, last_wait_s=q.last_wait_s)
            for model, q in state.queues().items()
        },
    )


async def provider_views(state: AdminState) -> dict[str, ProviderView]:
    """The catalog's provider models, with what this plane's gateway saw of each."""
    seen = state.provider_health()
    views = {}
    for record in await state.store.models.list():
        section = record.definition.get("provider")
        if not isinstance(section, dict):
            continue
        try:
            served = served_outside(ModelDefinition.model_validate(record.definition))
        except ValueError:
            continue  # a definition that no longer reads: 'llmgw ctl models' names its problem
        health = seen.get(record.name)
        views[record.name] = ProviderView(
            served_by=served,
            requests=health.requests if health else 0,
            last_error=health.last_error if health else "",
        )
    return views


def _planes(state: AdminState) -> list[ControlPlaneRecord]:
    return state.leadership.control_planes if state.leadership else []


async def vip_of(state: AdminState) -> str:
    """The floating address: this plane's own (``--vip``) or the cluster's (:data:`VIP_SETTING`)."""
    if state.vip:
        return state.vip
    stored = await state.store.settings.get(VIP_SETTING, "")
    return stored if isinstance(stored, str) else ""


def assigned_addresses(ip_json: str | bytes) -> set[IPAddress]:
    """Every address on this machine's interfaces, from ``ip -j addr show`` (netlink, iproute2)."""
    found: set[IPAddress] = set()
    for interface in json.loads(ip_json or "[]"):
        for info in interface.get("addr_info", ()):
            try:
                found.add(ipaddress.ip_address(str(info.get("local", "")).split("%")[0]))
            except ValueError:
                continue
    return found


async def address_assigned(address: str, ip: str = "ip") -> bool:
    """Whether ``address`` (``10.0.0.100`` or ``10.0.0.100/24``) is assigned to one of this machine's
    interfaces, as ``ip -j addr show`` lists them. A bind is no test: with ``ip_nonlocal_bind`` set
    it succeeds for any address."""
    try:
        wanted = ipaddress.ip_address(address.split("/")[0])
    except ValueError:
        return False
    try:
        process = await asyncio.create_subprocess_exec(
            ip, "-j", "addr", "show", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as error:
        log.warning("cannot tell whether %s is held here: %s (install iproute2)", address, error)
        return False
    try:
        out, err = await asyncio.wait_for(process.communicate(), IP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        log.warning(
            "cannot tell whether %s is held here: '%s -j addr show' took over %g s", address, ip, IP_TIMEOUT_S
        )
        return False
    if process.returncode != 0:
        log.warning("cannot tell whether %s is held here: %s", address, err.decode(errors="replace").strip())
        return False
    try:
        return wanted in assigned_addresses(out)
    except (ValueError, AttributeError) as error:
        log.warning("cannot read '%s -j addr show': %s", ip, error)
        return False
