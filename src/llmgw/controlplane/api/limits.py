"""``/api/limits``: requests, tokens, concurrency, budgets, models and expiry per key or owner.

A subject is ``key:ID`` or an owner's text (``project:ORG/TEAM/PROJECT``,
``team:ORG/TEAM``, ``org:ORG``, ``user:NAME``).

==========================================  ==========================================
route                                       needs
==========================================  ==========================================
``GET /api/limits``                         lists the limits of what the caller sees
``GET /api/limits/{subject}``               reading the subject (its key's place)
``PUT``/``DELETE /api/limits/key:ID``       writing keys of the key's place (a member)
``PUT``/``DELETE`` on a project or team     managing its parent (a team or org admin)
``PUT``/``DELETE`` on an org or user        a cluster admin
==========================================  ==========================================

A change reaches the gateway at once (with the keys: ``on_keys_changed``).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from llmgw.adminapi.limits import LimitsBody, LimitsView
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.limits import KEY_PREFIX, Limits
from llmgw.core.tenancy import CLUSTER, Action, Owner
from llmgw.errors import NotFound, ValidationFailed
from llmgw.store.limits import checked_subject

router = APIRouter(prefix="/api", tags=["limits"], dependencies=AUTH, responses=declared(401, 403, 503))


def _view(subject: str, limits: Limits) -> LimitsView:
    return LimitsView.model_validate({"subject": subject, **limits.as_dict()})


def _limits(body: LimitsBody) -> Limits:
    data = body.model_dump(exclude_none=True)
    try:
        return Limits.from_dict(data)
    except ValueError as error:
        raise ValidationFailed(
            [("body", str(error))], "give every limit as 0 or more, and a priority from 0 to 9"
        ) from None


async def _owner_of(state: AdminState, subject: str) -> Owner:
    """The owner whose roles decide over ``subject``: a key's place, or the owner itself."""
    if subject.startswith(KEY_PREFIX):
        return (await state.store.keys.find(subject[len(KEY_PREFIX) :])).place
    return Owner.parse(subject)


def _check_change(caller: Caller, subject: str, owner: Owner) -> None:
    if subject.startswith(KEY_PREFIX):
        caller.check(Action.WRITE if not owner.public else Action.OPERATE, owner)
        return
    parent = owner.parent() or CLUSTER
    caller.check(Action.OPERATE if parent.public else Action.MANAGE, parent)


async def _readable(state: AdminState, caller: Caller, subject: str) -> Owner:
    owner = await _owner_of(state, subject)
    if not caller.sees(owner):
        raise NotFound(f"no limits are set on {subject}", "'llmgw ctl limits list' lists the limits")
    return owner


@router.get("/limits", response_model=list[LimitsView])
async def list_limits(state: State, caller: Who) -> list[LimitsView]:
    """The limits the caller sees, by subject."""
    places = {f"{KEY_PREFIX}{k.id}": k.place for k in await state.store.keys.list(include_revoked=True)}
    out = []
    for subject, limits in (await state.store.limits.all()).items():
        owner = places.get(subject, CLUSTER) if subject.startswith(KEY_PREFIX) else Owner.parse(subject)
        if caller.sees(owner):
            out.append(_view(subject, limits))
    return out


@router.get("/limits/{subject:path}", response_model=LimitsView, responses=declared(400, 404))
async def get_limits(subject: str, state: State, caller: Who) -> LimitsView:
    """The limits set on one subject."""
    subject = checked_subject(subject)
    await _readable(state, caller, subject)
    return _view(subject, await state.store.limits.get(subject))


@router.put("/limits/{subject:path}", response_model=LimitsView, responses=declared(400, 404))
async def set_limits(subject: str, body: LimitsBody, state: State, caller: Who) -> LimitsView:
    """Set (replace) the limits of one subject; the gateway enforces them from the next request."""
    subject = checked_subject(subject)
    owner = await _readable(state, caller, subject)
    _check_change(caller, subject, owner)
    limits = await state.store.limits.set(subject, _limits(body))
    await state.store.audit.record(caller.name, "limits.set", subject, limits.as_dict())
    await state.on_keys_changed()
    return _view(subject, limits)


@router.delete(
    "/limits/{subject:path}", status_code=204, response_class=Response, responses=declared(400, 404)
)
async def remove_limits(subject: str, state: State, caller: Who) -> Response:
    """Remove every limit of one subject."""
    subject = checked_subject(subject)
    owner = await _readable(state, caller, subject)
    _check_change(caller, subject, owner)
    await state.store.limits.get(subject)  # 404 when none are set
    await state.store.limits.set(subject, Limits())
    await state.store.audit.record(caller.name, "limits.remove", subject)
    await state.on_keys_changed()
    return Response(status_code=204)
