"""``/api/orgs``, ``/api/teams``, ``/api/projects``: the tree models, adapters and keys are owned in.

=====================================  =========================================
route                                  needs
=====================================  =========================================
``GET`` any of them                    lists what the caller sees (a member of a
                                       team sees it and its org; a role over one
                                       sees what is below it)
``POST``/``DELETE /api/orgs``          cluster admin
``POST``/``DELETE /api/teams``         org admin of the team's organization
``POST``/``DELETE /api/projects``      team admin of the project's team
=====================================  =========================================

Removing one that still owns a model or holds an active key is refused (409).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from llmgw.adminapi.tenancy import Name, OrgRequest, ProjectRequest, TeamRequest, UnitView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.tenancy import CLUSTER, Action, Owner, OwnerKind
from llmgw.store.tenants import Unit

router = APIRouter(prefix="/api", tags=["tenancy"], dependencies=AUTH, responses=declared(401, 403, 503))


def _view(unit: Unit) -> UnitView:
    return UnitView(owner=str(unit.owner), path=unit.path, created_at=unit.created_at)


async def _listed(state: AdminState, caller: Caller, kind: OwnerKind, within: str = "") -> list[UnitView]:
    return [_view(u) for u in await state.store.tenants.list(kind, within) if caller.sees(u.owner)]


async def _create(state: AdminState, caller: Caller, owner: Owner) -> UnitView:
    parent = owner.parent() or CLUSTER
    caller.check(Action.OPERATE if parent.public else Action.MANAGE, parent)
    unit = await state.store.tenants.create(owner.kind, owner.path)
    await state.store.audit.record(caller.name, f"{owner.kind.value}.create", str(owner))
    return _view(unit)


async def _remove(state: AdminState, caller: Caller, owner: Owner) -> Response:
    parent = owner.parent() or CLUSTER
    caller.check(Action.OPERATE if parent.public else Action.MANAGE, parent)
    await state.store.tenants.remove(owner.kind, owner.path)
    await state.store.audit.record(caller.name, f"{owner.kind.value}.remove", str(owner))
    await state.access_changed()  # roles bound there went with it
    return Response(status_code=204)


@router.get("/orgs", response_model=list[UnitView])
async def list_orgs(state: State, caller: Who) -> list[UnitView]:
    """The organizations the caller sees."""
    return await _listed(state, caller, OwnerKind.ORG)


@router.post("/orgs", status_code=201, response_model=UnitView, responses=declared(400, 409))
async def create_org(body: OrgRequest, state: State, caller: Who) -> UnitView:
    """Create an organization (cluster admins)."""
    return await _create(state, caller, Owner(OwnerKind.ORG, body.name))


@router.delete("/orgs/{org}", status_code=204, response_class=Response, responses=declared(400, 404, 409))
async def remove_org(org: Name, state: State, caller: Who) -> Response:
    """Remove an organization with its teams and projects (none may own a model or hold a key)."""
    return await _remove(state, caller, Owner(OwnerKind.ORG, org))


@router.get("/teams", response_model=list[UnitView], responses=declared(400))
async def list_teams(state: State, caller: Who, org: str = "") -> list[UnitView]:
    """The teams the caller sees (of ``org`` only, when given)."""
    checked_text("query.org", org)
    return await _listed(state, caller, OwnerKind.TEAM, org)


@router.post("/teams", status_code=201, response_model=UnitView, responses=declared(400, 404, 409))
async def create_team(body: TeamRequest, state: State, caller: Who) -> UnitView:
    """Create a team in an organization (its org admins)."""
    return await _create(state, caller, Owner(OwnerKind.TEAM, f"{body.org}/{body.name}"))


@router.delete(
    "/teams/{org}/{team}", status_code=204, response_class=Response, responses=declared(400, 404, 409)
)
async def remove_team(org: Name, team: Name, state: State, caller: Who) -> Response:
    """Remove a team with its projects (none may own a model or hold a key)."""
    return await _remove(state, caller, Owner(OwnerKind.TEAM, f"{org}/{team}"))


@router.get("/projects", response_model=list[UnitView], responses=declared(400))
async def list_projects(state: State, caller: Who, team: str = "") -> list[UnitView]:
    """The projects the caller sees (of ``team``, written ``org/team``, only, when given)."""
    checked_text("query.team", team)
    return await _listed(state, caller, OwnerKind.PROJECT, team)


@router.post("/projects", status_code=201, response_model=UnitView, responses=declared(400, 404, 409))
async def create_project(body: ProjectRequest, state: State, caller: Who) -> UnitView:
    """Create a project in a team (its team admins)."""
    return await _create(state, caller, Owner(OwnerKind.PROJECT, f"{body.org}/{body.team}/{body.name}"))


@router.delete(
    "/projects/{org}/{team}/{project}",
    status_code=204,
    response_class=Response,
    responses=declared(400, 404, 409),
)
async def remove_project(org: Name, team: Name, project: Name, state: State, caller: Who) -> Response:
    """Remove a project (it may own no model nor hold a key)."""
    return await _remove(state, caller, Owner(OwnerKind.PROJECT, f"{org}/{team}/{project}"))
