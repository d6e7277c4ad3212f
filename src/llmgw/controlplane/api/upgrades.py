"""``/api/upgrades/agents``: roll a signed release over the agents, one node at a time (C9.3)."""

from __future__ import annotations

from fastapi import APIRouter

from llmgw.adminapi.upgrades import AgentUpgradeRequest, RolloutView
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, AdminState, State, Who
from llmgw.controlplane.lifecycle.upgrading import AgentUpgrades, Rollout
from llmgw.errors import NotFound

router = APIRouter(
    prefix="/api",
    tags=["upgrades"],
    dependencies=CLUSTER_ROLE,
    responses=declared(400, 401, 403, 404, 409, 503),
)


def _upgrades(state: AdminState) -> AgentUpgrades:
    if state.upgrades is None:
        raise NotFound(
            "this control plane does not upgrade agents", hint="ask the leader ('llmgw ctl status' names it)"
        )
    return state.upgrades


def _view(rollout: Rollout) -> RolloutView:
    return RolloutView(
        version=rollout.version,
        nodes=list(rollout.nodes),
        upgraded=list(rollout.upgraded),
        current=rollout.current,
        error=rollout.error,
        finished=rollout.finished,
    )


@router.post("/upgrades/agents", response_model=RolloutView, status_code=202)
async def upgrade_agents(body: AgentUpgradeRequest, state: State, caller: Who) -> RolloutView:
    """Check the release (signed by the trusted key, its files in the mirror), then upgrade the
    agents one node at a time; the answer is the rollout as it starts."""
    upgrades = _upgrades(state)
    release = upgrades.release(body.sums, body.signature)
    rollout = await upgrades.start(release, body.nodes)
    await state.store.audit.record(
        caller.name, "agents.upgrade", release.version, {"nodes": rollout.nodes, "version": release.version}
    )
    return _view(rollout)


@router.get("/upgrades/agents", response_model=RolloutView)
async def agent_upgrade(state: State) -> RolloutView:
    """The last rollout of a release over the agents: where it stands, or why it stopped."""
    rollout = _upgrades(state).rollout
    if rollout is None:
        raise NotFound(
            "no agent upgrade was started", hint="start one with 'llmgw ctl upgrade agents --release DIR'"
        )
    return _view(rollout)
