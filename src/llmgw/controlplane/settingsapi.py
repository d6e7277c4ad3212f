"""The admin API's cluster settings (``/api/settings``) and agent restarts (``/api/agents/restart``).

Every change is validated, kept with its history and audited; a change of
agents' settings is sent to the nodes a second later (C2.4).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from llmgw.controlplane.agentsettings import SettingsCheck, SettingsPush, setting_problems
from llmgw.controlplane.fleet import Fleet
from llmgw.core.agentsettings import is_agent_key
from llmgw.core.nodes import RestartAgent
from llmgw.errors import ChannelClosed, NotFound, ValidationFailed
from llmgw.store.database import Store

log = logging.getLogger(__name__)


class RestartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="llmgw restart", max_length=200)


def add_settings_routes(
    app: FastAPI,
    auth: list[Any],
    store: Store,
    fleet: Fleet,
    push: SettingsPush | None,
    check_agents: SettingsCheck,
) -> None:
    """Add the settings and restart routes to ``app`` (each behind ``auth``)."""

    @app.get("/api/settings", dependencies=auth)
    async def list_settings() -> dict[str, Any]:
        """Every setting that is set, by key."""
        return await store.settings.all()

    @app.get("/api/settings-history", dependencies=auth)
    async def history(key: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The last changes (of ``key``, or of every setting), newest first."""
        return [
            {
                "key": c.key,
                "value": c.value,
                "deleted": c.deleted,
                "at": c.changed_at.isoformat(),
                "actor": c.actor,
            }
            for c in await store.settings.history(key, max(0, min(limit, 10_000)))
        ]

    @app.get("/api/settings/{key:path}", dependencies=auth)
    async def get_setting(key: str) -> dict[str, Any]:
        missing = object()
        value = await store.settings.get(key, missing)
        if value is missing:
            raise NotFound(f"setting {key!r} is not set", "list the settings with 'llmgw ctl config list'")
        return {"key": key, "value": value}

    @app.put("/api/settings/{key:path}", dependencies=auth)
    async def set_setting(key: str, request: Request) -> dict[str, Any]:
        """Set ``key`` to the body's ``value``; agents' settings are checked as agent.yaml is."""
        body = await _json(request)
        if not isinstance(body, dict) or set(body) != {"value"}:
            raise ValidationFailed([("body", 'send {"value": ...}')], "send the value as JSON")
        value = body["value"]
        problems = setting_problems(key, value, check_agents)
        if problems:
            raise ValidationFailed(
                [
                    (f"{key}.{field}" if field not in ("key", "value") else field, why)
                    for field, why in problems
                ],
                "fix or remove the keys named; node_id, control_planes, address and tls stay in agent.yaml",
            )
        await store.settings.set(key, value, "admin")
        await store.audit.record("admin", "setting.set", key, {"value": value})
        if push is not None and is_agent_key(key):
            push.changed()
        return {"key": key, "value": value}

    @app.delete("/api/settings/{key:path}", dependencies=auth, status_code=204)
    async def delete_setting(key: str) -> Response:
        await store.settings.delete(key, "admin")
        await store.audit.record("admin", "setting.delete", key)
        if push is not None and is_agent_key(key):
            push.changed()
        return Response(status_code=204)

    @app.post("/api/agents/restart", dependencies=auth)
    async def restart_agents(body: RestartRequest) -> dict[str, Any]:
        """Send RestartAgent to every connected agent; their engines keep serving (C2.6)."""
        sent = []
        for node_id, node in sorted(fleet.nodes.items()):
            try:
                await node.channel.send(RestartAgent(reason=body.reason))
            except ChannelClosed as error:
                log.warning("could not ask node %s to restart: %s", node_id, error)
                continue
            sent.append(node_id)
        await store.audit.record("admin", "agents.restart", ",".join(sent), {"reason": body.reason})
        return {"restarted": sent}


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValidationFailed([("body", f"not valid JSON: {error}")], "send a JSON object") from None
