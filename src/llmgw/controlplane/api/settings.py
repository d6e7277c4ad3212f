"""``/api/settings``: the cluster's settings, each change kept with its history and audited.

Only the keys llmgw reads may be set, each holding a value of its type
(:mod:`llmgw.core.settingtypes`); anything else is refused naming the keys.

A change of agents' settings (``agents.default``, ``agents.nodes.<id>``) is
checked as agent.yaml is and sent to the nodes a second later (C2.4).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from llmgw.adminapi.schemas import SettingChange, SettingRequest, Settings, SettingSet, SettingView
from llmgw.adminapi.textfields import checked_text
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State, Who
from llmgw.controlplane.nodes.agentsettings import setting_problems
from llmgw.core.agentsettings import is_agent_key
from llmgw.core.pricing import CURRENCY_SETTING, priced_model
from llmgw.core.settingtypes import FIREWALL_ENABLED, SERVING_STOPPED, key_problem, value_problem
from llmgw.errors import NotFound, ValidationFailed

router = APIRouter(
    prefix="/api", tags=["settings"], dependencies=CLUSTER_ROLE, responses=declared(401, 503, 403)
)

_MISSING = object()


@router.get("/settings", response_model=Settings)
async def list_settings(state: State) -> Settings:
    """Every setting that is set, by key."""
    return Settings(await state.store.settings.all())


@router.get("/settings-history", response_model=list[SettingChange])
async def history(state: State, key: str | None = None, limit: int = 100) -> list[SettingChange]:
    """The last changes (of ``key``, or of every setting), newest first."""
    if key is not None:
        checked_text("query.key", key)
    return [
        SettingChange(key=c.key, value=c.value, deleted=c.deleted, at=c.changed_at, actor=c.actor)
        for c in await state.store.settings.history(key, max(0, min(limit, 10_000)))
    ]


@router.get("/settings/{key:path}", response_model=SettingView, responses=declared(404))
async def get_setting(key: str, state: State) -> SettingView:
    """One setting's value."""
    checked_text("key", key)
    value = await state.store.settings.get(key, _MISSING)
    if value is _MISSING:
        raise NotFound(f"setting {key!r} is not set", "list the settings with 'llmgw ctl config list'")
    return SettingView(key=key, value=value)


@router.put("/settings/{key:path}", response_model=SettingSet, responses=declared(400, 404))
async def set_setting(key: str, body: SettingRequest, state: State, caller: Who) -> SettingSet:
    """Set ``key`` to the body's ``value``; agents' settings are checked as agent.yaml is."""
    checked_text("key", key)
    if why := key_problem(key):
        raise ValidationFailed(
            [("key", why)], "set one of the settings named ('llmgw ctl config set KEY VALUE')"
        )
    problems = setting_problems(key, body.value, state.check_agent_settings)
    if not problems and (why := value_problem(key, body.value)):
        raise ValidationFailed(
            [("value", why)], 'send the value as the type named (a bool: {"value": false})'
        )
    if problems:
        raise ValidationFailed(
            [(f"{key}.{field}" if field not in ("key", "value") else field, why) for field, why in problems],
            "fix or remove the keys named; node_id, control_planes, address and tls stay in agent.yaml",
        )
    warnings = await _price_warnings(key, state)
    await state.store.settings.set(key, body.value, caller.name)
    await state.store.audit.record(caller.name, "setting.set", key, {"value": body.value})
    await _changed(key, state)
    return SettingSet(key=key, value=body.value, warnings=warnings)


async def _price_warnings(key: str, state: State) -> list[str]:
    """A price for a model the catalog does not hold is kept (the model may come), and warned of."""
    model = priced_model(key)
    if model is None or model in {m.name for m in await state.store.models.list()}:
        return []
    return [
        f"no model named {model!r} is in the catalog; the price applies once one is ('llmgw ctl model list')"
    ]


async def _changed(key: str, state: State) -> None:
    state.changes.changed("serving" if key == SERVING_STOPPED else "settings")
    if state.settings_push is not None and (is_agent_key(key) or key == FIREWALL_ENABLED):
        state.settings_push.changed()  # firewall.enabled goes to every node with its settings
    if key == CURRENCY_SETTING or priced_model(key) is not None:
        await state.on_keys_changed()  # prices reach the gateway with the keys and limits


@router.delete("/settings/{key:path}", status_code=204, response_class=Response, responses=declared(400, 404))
async def delete_setting(key: str, state: State, caller: Who) -> Response:
    """Remove a setting (its history stays)."""
    checked_text("key", key)
    await state.store.settings.delete(key, caller.name)
    await state.store.audit.record(caller.name, "setting.delete", key)
    await _changed(key, state)
    return Response(status_code=204)
