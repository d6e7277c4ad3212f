"""``/api/users``: users and their roles (membership of organizations and teams), and ``/api/me``.

======================================  ==========================================
route                                   needs
======================================  ==========================================
``GET /api/me``                         any token: who it is, with its roles
``GET /api/users``                      lists the caller, and users holding a role
                                        where the caller may read (all: a viewer at
                                        the cluster)
``POST``/``DELETE /api/users``          cluster admin
``PUT /api/users/{user}/roles``         at the cluster: cluster admin; at an org or
                                        team: an admin there (team admin of a team,
                                        org admin of an org or its teams) whose own
                                        role there is at least the one given
``DELETE /api/users/{user}/roles``      an admin of the scope (as above)
======================================  ==========================================
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from llmgw.adminapi.tenancy import Name, RoleRequest, RoleView, UserRequest, UserView, WhoView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.admin.callers import ADMIN, Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.tenancy import CLUSTER, Action, Binding, Owner, OwnerKind, Role
from llmgw.errors import Forbidden, NotFound, ValidationFailed
from llmgw.store.users import UserRecord

router = APIRouter(prefix="/api", tags=["users"], dependencies=AUTH, responses=declared(401, 403, 503))


def roles_of(bindings: tuple[Binding, ...]) -> list[RoleView]:
    return [RoleView(role=b.role.label, scope=str(b.scope)) for b in bindings]


def _view(user: UserRecord) -> UserView:
    return UserView(name=user.name, created_at=user.created_at, roles=roles_of(user.bindings))


def _shown(caller: Caller, user: UserRecord) -> bool:
    return (
        user.name == caller.name
        or any(caller.may(Action.READ, b.scope) for b in user.bindings)
        or bool(caller.may(Action.READ, CLUSTER))
    )


async def _seen(state: AdminState, caller: Caller, name: str) -> UserRecord:
    user = await state.store.users.get(name)
    if not _shown(caller, user):
        raise NotFound(f"no user is called {name!r}", "'llmgw ctl user list' lists the users")
    return user


def _check_binding(caller: Caller, scope: Owner, role: Role | None) -> None:
    """An admin of ``scope`` (cluster admin at the cluster) may give there a role up to their own."""
    if scope.public:
        caller.check(Action.OPERATE, CLUSTER)
        return
    caller.check(Action.MANAGE, scope)
    held = caller.role_over(scope)
    if role is not None and (held is None or role > held):
        raise Forbidden(
            f"{caller.name} may not give {role.label} at {scope}: above the caller's own role there",
            "ask an administrator above it",
        )


@router.get("/me", response_model=WhoView)
async def me(caller: Who) -> WhoView:
    """Who the token belongs to, with the roles it acts with."""
    return WhoView(name=caller.name, roles=roles_of(caller.bindings))


@router.get("/users", response_model=list[UserView])
async def list_users(state: State, caller: Who) -> list[UserView]:
    """The users the caller may see, with their roles."""
    return [_view(u) for u in await state.store.users.list() if _shown(caller, u)]


@router.get("/users/{name}", response_model=UserView, responses=declared(400, 404))
async def get_user(name: Name, state: State, caller: Who) -> UserView:
    return _view(await _seen(state, caller, name))


@router.post("/users", status_code=201, response_model=UserView, responses=declared(400, 409))
async def create_user(body: UserRequest, state: State, caller: Who) -> UserView:
    """Create a user with no role (cluster admins); give roles with ``PUT /api/users/{user}/roles``."""
    caller.check(Action.OPERATE, CLUSTER)
    if body.name == ADMIN:
        raise ValidationFailed([("name", "is the first admin token's name")], "choose another name")
    user = await state.store.users.create(body.name)
    await state.store.audit.record(caller.name, "user.create", body.name)
    return _view(user)


@router.delete("/users/{name}", status_code=204, response_class=Response, responses=declared(400, 404))
async def remove_user(name: Name, state: State, caller: Who) -> Response:
    """Remove a user with their roles and tokens (their keys stay until revoked)."""
    caller.check(Action.OPERATE, CLUSTER)
    await state.store.users.remove(name)
    await state.store.audit.record(caller.name, "user.remove", name)
    await state.access_changed()
    return Response(status_code=204)


@router.put("/users/{name}/roles", response_model=UserView, responses=declared(400, 404))
async def bind_role(name: Name, body: RoleRequest, state: State, caller: Who) -> UserView:
    """Give the user a role at the cluster, an organization or a team (replacing the one held there)."""
    scope = Owner.parse(body.scope)
    try:
        binding = Binding(Role.parse(body.role), scope)
    except ValueError as error:
        raise ValidationFailed([("scope", str(error))], "bind the role where it belongs") from None
    _check_binding(caller, scope, binding.role)
    if scope.kind in (OwnerKind.ORG, OwnerKind.TEAM) and not await state.store.tenants.exists(scope):
        raise NotFound(f"{scope} does not exist", "'llmgw ctl org list' and 'team list' list them")
    await state.store.users.bind(name, binding)
    await state.store.audit.record(caller.name, "role.bind", name, {"role": body.role, "scope": str(scope)})
    await state.access_changed()
    return _view(await state.store.users.get(name))


@router.delete("/users/{name}/roles", status_code=204, response_class=Response, responses=declared(400, 404))
async def unbind_role(name: Name, state: State, caller: Who, scope: str = "") -> Response:
    """Take away the role the user holds at ``scope`` (empty: the cluster)."""
    checked_text("query.scope", scope)
    try:
        where = Owner.parse(scope)
    except ValueError as error:
        raise ValidationFailed([("query.scope", str(error))], "name an org or team, or none") from None
    _check_binding(caller, where, None)
    await state.store.users.unbind(name, where)
    await state.store.audit.record(caller.name, "role.unbind", name, {"scope": str(where)})
    await state.access_changed()
    return Response(status_code=204)
