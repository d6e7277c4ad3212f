"""The one object every admin route depends on, and the admin token check.

:class:`AdminState` holds what the routes read and change (store, fleet,
reconciler, mirror, leadership...). The app keeps it in ``app.state.admin``;
routes take it through FastAPI's ``Depends`` (:data:`State`), and every
``/api`` router checks the bearer token with :func:`check_token`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from llmgw.controlplane.agentsettings import SettingsCheck, SettingsPush, forbidden_only
from llmgw.controlplane.fleet import Fleet
from llmgw.controlplane.leadership import Leadership
from llmgw.controlplane.reconciling import Reconciler
from llmgw.core.health import ComponentHealth
from llmgw.errors import Unauthorized
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store


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


def admin_state(request: Request) -> AdminState:
    """The app's :class:`AdminState` (a FastAPI dependency)."""
    state: AdminState = request.app.state.admin
    return state


State = Annotated[AdminState, Depends(admin_state)]
"""A route's parameter type for the admin state."""


WRONG_TOKEN = "missing or wrong admin token"
WRONG_TOKEN_HINT = "send 'Authorization: Bearer <token>' with the token in admin.token beside server.yaml"


def token_matches(authorization: str, token_sha256: str) -> bool:
    """Whether an ``Authorization`` header carries the admin token (``Bearer <token>``) of that sha256."""
    token = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else ""
    digest = hashlib.sha256(token.encode()).hexdigest()
    return bool(token) and hmac.compare_digest(digest, token_sha256)


def check_token(request: Request, state: State) -> None:
    """Refuse a request without the admin token (also checked before any body, by the admission layer:
    this check covers what reaches the app otherwise, a standby's relayed requests)."""
    if not token_matches(request.headers.get("authorization", ""), state.token_sha256):
        raise Unauthorized(WRONG_TOKEN, WRONG_TOKEN_HINT)


AUTH = [Depends(check_token)]
"""The dependencies of every ``/api`` router."""
