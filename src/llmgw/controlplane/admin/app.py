"""The admin API's app: the routers of :mod:`llmgw.controlplane.api` over one :class:`AdminState`.

``/api/openapi.json`` describes every route's request and answer; ``/api/docs``
shows it. Every ``/api`` route wants a token (bearer): the admin token or a
user's, whose roles each route checks against what it touches (docs/tenancy.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import Match

from llmgw import __version__
from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.admin.changes import Changes
from llmgw.controlplane.admin.signin import router as signin_router
from llmgw.controlplane.api import (
    agents,
    audit,
    batches,
    catalog,
    events,
    gpuhistory,
    keys,
    knowledge,
    limits,
    mirror,
    nodes,
    plan,
    presets,
    pulls,
    replicas,
    restart,
    serving,
    settings,
    status,
    tokens,
    training,
    units,
    upgrades,
    usage,
    users,
)
from llmgw.controlplane.api.errors import add_error_handlers, describe_400_not_422
from llmgw.controlplane.api.state import AdminState, no_components
from llmgw.controlplane.config import MirrorSettings
from llmgw.controlplane.lifecycle.leadership import Leadership
from llmgw.controlplane.lifecycle.upgrading import AgentUpgrades
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.controlplane.nodes.agentsettings import SettingsCheck, SettingsPush, forbidden_only
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.gpu_history import GpuHistory
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.training.scheduling import TrainingScheduler
from llmgw.core.health import ComponentHealth
from llmgw.errors import NotFound
from llmgw.knowledge.service import Knowledge
from llmgw.mirror.blobs import BlobStore
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.database import Store
from llmgw.training.pairs import CollectionPairs

__all__ = ["AdminApi"]

ROUTERS = (
    status.router,
    serving.router,
    nodes.router,
    gpuhistory.router,
    replicas.router,
    catalog.router,
    keys.router,
    mirror.router,
    pulls.router,
    settings.router,
    agents.router,
    restart.router,
    audit.router,
    units.router,
    users.router,
    tokens.router,
    usage.router,
    limits.router,
    events.router,
    plan.router,
    presets.router,
    upgrades.router,
    training.router,
    knowledge.router,
    batches.router,
)


UNKNOWN = "/api/{rest:path}"
"""The route that answers every /api path no other route takes."""


def methods_on(request: Request) -> list[str]:
    """The methods the routes on ``request``'s path take (empty: no route has that path)."""
    found: set[str] = set()
    for router in (status.probes, *ROUTERS):
        for route in router.routes:
            if isinstance(route, APIRoute) and route.matches(request.scope)[0] is not Match.NONE:
                found |= route.methods or set()
    return sorted(found)


class AdminApi:
    """Builds the FastAPI app; the routes read and change the store and the fleet."""

    def __init__(
        self,
        *,
        name: str,
        token_sha256: str,
        store: Store,
        fleet: Fleet,
        reconciler: Reconciler,
        blobs: BlobStore,
        on_keys_changed: Callable[[], Awaitable[None]],
        leadership: Leadership | None = None,
        settings_push: SettingsPush | None = None,
        check_agent_settings: SettingsCheck = forbidden_only,
        components: Callable[[], Sequence[ComponentHealth]] = no_components,
        vip: str = "",
        callers: Callers | None = None,
        gpu_history: GpuHistory | None = None,
        changes: Changes | None = None,
        clock: Clock = SYSTEM_CLOCK,
        replicator: MirrorReplicator | None = None,
        upgrades: AgentUpgrades | None = None,
        training: TrainingScheduler | None = None,
        knowledge: Knowledge | None = None,
        collection_pairs: CollectionPairs | None = None,
        mirror: MirrorSettings | None = None,
    ) -> None:
        self.state = AdminState(
            name=name,
            token_sha256=token_sha256,
            store=store,
            fleet=fleet,
            reconciler=reconciler,
            blobs=blobs,
            on_keys_changed=on_keys_changed,
            leadership=leadership,
            settings_push=settings_push,
            check_agent_settings=check_agent_settings,
            components=components,
            vip=vip,
            callers=callers,
            gpu_history=gpu_history or GpuHistory(),
            changes=changes if changes is not None else fleet.changes,
            clock=clock,
            replicator=replicator,
            upgrades=upgrades,
            training=training,
            knowledge=knowledge,
            collection_pairs=collection_pairs,
            mirror=mirror or MirrorSettings(),
        )

    @property
    def reconciler(self) -> Reconciler:
        return self.state.reconciler

    @property
    def vip(self) -> str:
        """The floating address kept on the leader (empty: none), shown by /api/status."""
        return self.state.vip

    def app(self) -> FastAPI:
        app = FastAPI(
            title="llmgw admin API",
            version=__version__,
            docs_url="/api/docs",
            openapi_url="/api/openapi.json",
            redoc_url=None,
        )
        app.state.admin = self.state
        add_error_handlers(app)
        describe_400_not_422(app)
        app.include_router(status.probes)
        app.include_router(signin_router)
        for router in ROUTERS:
            app.include_router(router)

        @app.api_route(UNKNOWN, methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
        async def unknown(rest: str, request: Request) -> None:
            allowed = methods_on(request)
            if allowed:
                raise HTTPException(405, headers={"Allow": ", ".join(allowed)})
            raise NotFound(f"no admin route /api/{rest}", "see /api/docs for the routes")

        return app
