"""The one object every admin route depends on, and who is calling.

:class:`AdminState` holds what the routes read and change (store, fleet,
reconciler, mirror, leadership...). The app keeps it in ``app.state.admin``;
routes take it through FastAPI's ``Depends`` (:data:`State`). Every ``/api``
router checks the bearer token with :func:`check_token` (the first admin
token, or a user's live token: :mod:`llmgw.controlplane.admin.callers`); a route
takes the caller as :data:`Who` and checks the caller's role against the
owner of what it touches (docs/tenancy.md has the table). Routers of the
cluster's own machinery take :data:`CLUSTER_ROLE`: reading needs a viewer at
the cluster, anything else a cluster admin.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from llmgw.controlplane.admin.callers import Caller, Callers
from llmgw.controlplane.admin.changes import Changes
from llmgw.controlplane.config import MirrorSettings
from llmgw.controlplane.lifecycle.leadership import Leadership
from llmgw.controlplane.lifecycle.selfrestart import SelfRestart
from llmgw.controlplane.lifecycle.upgrading import AgentUpgrades
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.controlplane.nodes.agentsettings import SettingsCheck, SettingsPush, forbidden_only
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.gpu_history import GpuHistory
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.training.scheduling import TrainingScheduler
from llmgw.core.health import ComponentHealth
from llmgw.core.tenancy import CLUSTER, Action
from llmgw.errors import BadRequest, Unauthorized
from llmgw.gateway.provider_calls import ProviderHealth
from llmgw.gateway.queueing import QueueState
from llmgw.knowledge.service import Knowledge
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.pulling import Pulls
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.database import Store
from llmgw.training.pairs import CollectionPairs


def no_queues() -> Mapping[str, QueueState]:
    return {}


def no_providers() -> Mapping[str, ProviderHealth]:
    return {}


def no_components() -> Sequence[ComponentHealth]:
    """The default when nothing supervised is reported: none."""
    return []


@dataclass
class AdminState:
    """What the admin routes work on."""

    name: str
    """This control plane's name."""
    token_sha256: str
    """sha256 (hex) of the admin token."""
    store: Store
    fleet: Fleet
    reconciler: Reconciler
    blobs: BlobStore
    on_keys_changed: Callable[[], Awaitable[None]]
    """Called after a key is created or revoked, so the gateway's ring reloads."""
    leadership: Leadership | None = None
    settings_push: SettingsPush | None = None
    check_agent_settings: SettingsCheck = forbidden_only
    components: Callable[[], Sequence[ComponentHealth]] = no_components
    """This process's supervised components, for /api/status."""
    vip: str = ""
    """The floating address kept on the leader (empty: none)."""
    started: float = field(default_factory=time.time)
    callers: Callers | None = None
    """Who may call: the admin token and users' live tokens (None: the admin token alone)."""
    gpu_history: GpuHistory = field(default_factory=GpuHistory)
    """Each card's recent readings, from the nodes' telemetry (``/api/gpu-history``)."""
    changes: Changes = field(default_factory=Changes)
    """What changed, for /api/events: the fleet and the reconciler tell the same publisher."""
    clock: Clock = SYSTEM_CLOCK
    """Paces /api/events (coalescing, keepalives)."""
    provider_health: Callable[[], Mapping[str, ProviderHealth]] = no_providers
    """What this plane's gateway saw of each provider model (its requests, its last error)."""
    queues: Callable[[], Mapping[str, QueueState]] = no_queues
    """The flow queues of this plane's gateway and its workers, by model (``gateway.flow``)."""
    pull_jobs: Pulls | None = None
    """Pulls from Hugging Face and Ollama into the mirror (None: made on first use)."""
    upgrades: AgentUpgrades | None = None
    """Rolls signed releases over the agents (``/api/upgrades/agents``); None: not here."""
    replicator: MirrorReplicator | None = None
    """Records this plane's copy of an import and waits for its peers' (None: no copies recorded)."""
    self_restart: SelfRestart = field(default_factory=SelfRestart)
    """Set by ``/api/control-plane/restart``: this process stops cleanly and starts again."""
    training: TrainingScheduler | None = None
    """Runs training jobs while leading (None: jobs wait in the store); ``collection_pairs``: where
    pairs from knowledge collections come from (None: not available)."""
    collection_pairs: CollectionPairs | None = None
    knowledge: Knowledge | None = None
    """Knowledge collections (``/api/knowledge``); None: not kept here."""
    mirror: MirrorSettings = field(default_factory=MirrorSettings)
    """The mirror's bounds: the largest upload, each user's quota."""

    def __post_init__(self) -> None:
        if self.callers is None:
            self.callers = Callers(self.token_sha256)

    @property
    def pulls(self) -> Pulls:
        if self.pull_jobs is None:
            self.pull_jobs = Pulls(self.blobs, self.store)
        return self.pull_jobs

    @property
    def who(self) -> Callers:
        assert self.callers is not None
        return self.callers

    async def access_changed(self) -> None:
        """Keys, users, roles or tokens changed: reload the callers and the gateway's keys."""
        await self.who.load(self.store)
        await self.on_keys_changed()


def admin_state(request: Request) -> AdminState:
    """The app's :class:`AdminState` (a FastAPI dependency)."""
    state: AdminState = request.app.state.admin
    return state


State = Annotated[AdminState, Depends(admin_state)]
"""A route's parameter type for the admin state."""


TWO_TOKENS = "the request has more than one Authorization header"
TWO_TOKENS_HINT = "send one: 'Authorization: Bearer <token>'"

WRONG_TOKEN = "missing, wrong, expired or revoked token"
WRONG_TOKEN_HINT = (
    "send 'Authorization: Bearer <token>' with the token in admin.token beside server.yaml, or a user's "
    "token ('llmgw ctl user token create USER')"
)


def check_token(request: Request, state: State) -> Caller:
    """The caller, or 401 without a live token (also checked before any body, by the admission layer:
    this check covers what reaches the app otherwise, a standby's relayed requests)."""
    given = request.headers.getlist("authorization")
    if len(given) > 1:
        raise BadRequest(TWO_TOKENS, TWO_TOKENS_HINT)
    caller = state.who.identify(given[0] if given else "")
    if caller is None:
        raise Unauthorized(WRONG_TOKEN, WRONG_TOKEN_HINT)
    return caller


Who = Annotated[Caller, Depends(check_token)]
"""A route's parameter type for the caller."""

AUTH = [Depends(check_token)]
"""The dependencies of every ``/api`` router."""


def check_cluster_role(request: Request, caller: Who) -> None:
    """Reading the cluster's machinery needs a viewer at the cluster; changing it, a cluster admin."""
    caller.check(Action.READ if request.method in ("GET", "HEAD") else Action.OPERATE, CLUSTER)


CLUSTER_ROLE = [Depends(check_cluster_role)]
"""Dependencies of the routers of the cluster's machinery: nodes, replicas, settings, serving, agents."""
