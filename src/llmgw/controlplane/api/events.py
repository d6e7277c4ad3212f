"""``GET /api/events``: server-sent events, one per view that changed, for the console and the portal.

The stream (``text/event-stream``) carries ``event: <kind>`` and ``data: <json>``
frames, where the data is the whole view its GET route answers: ``nodes``
(``/api/nodes``), ``replicas`` (``/api/replicas``), ``models`` (``/api/models``),
``settings`` (``/api/settings``), ``serving`` (``{"stopped": bool}``, what ``PUT
/api/serving`` answers), ``keys`` (``/api/keys``) and ``status`` (``/api/status``).
On connect it sends one of each kind the caller may read; then one when that
kind changed (:mod:`llmgw.controlplane.admin.changes`), at most one per kind every
:data:`COALESCE_S`; a ``: keepalive`` comment every :data:`KEEPALIVE_S` without
one. Each kind is read under the caller's roles as its route reads it: nodes,
replicas, settings and serving need a viewer at the cluster; models and keys
show what the caller sees. A caller whose token is revoked sees the stream end, and so does
every caller of a leader that lost its lease (its views would go stale; a standby
relays a new stream to the new leader).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import StreamingResponse

from llmgw.adminapi.schemas import ServingView
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.admin.changes import KINDS, Kind, Subscription
from llmgw.controlplane.api import catalog, keys, nodes, replicas, settings, status
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, AdminState, State, Who
from llmgw.core.settingtypes import SERVING_STOPPED
from llmgw.core.tenancy import CLUSTER, Action
from llmgw.errors import LlmgwError

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api", tags=["events"], dependencies=AUTH, responses=declared(401, 503))

COALESCE_S = 0.5
"""The least time between two events of one kind."""
KEEPALIVE_S = 15.0
"""A comment line goes out after this long without an event."""
KEEPALIVE = ": keepalive\n\n"

CLUSTER_KINDS: frozenset[Kind] = frozenset({"nodes", "replicas", "settings", "serving"})
"""Kinds only a viewer at the cluster reads (as their routes)."""

EVENTS_DESCRIPTION = (
    "Server-sent events: `event: <kind>` and `data: <json>` per change, kind one of "
    + ", ".join(KINDS)
    + "; the data is the whole view the kind's GET route answers. One of each kind on connect, "
    "then at most one per kind every 0.5 s; `: keepalive` every 15 s."
)


async def _serving(state: AdminState) -> ServingView:
    return ServingView(stopped=await state.store.settings.get(SERVING_STOPPED, False) is True)


def _readers(state: AdminState, caller: Caller) -> dict[Kind, Callable[[], Awaitable[Any]]]:
    """How each kind's view is read, as its route reads it for ``caller``."""
    return {
        "nodes": lambda: nodes.nodes(state),
        "replicas": lambda: replicas.replicas(state),
        "models": lambda: catalog.list_models(state, caller),
        "settings": lambda: settings.list_settings(state),
        "serving": lambda: _serving(state),
        "keys": lambda: keys.list_keys(state, caller),
        "status": lambda: status.status(state),
    }


def readable(caller: Caller) -> tuple[Kind, ...]:
    """The kinds ``caller`` may read: all for a viewer at the cluster, else those filtered by owner."""
    if caller.may(Action.READ, CLUSTER):
        return KINDS
    return tuple(kind for kind in KINDS if kind not in CLUSTER_KINDS)


def frame(kind: Kind, view: Any) -> str:
    """One event: the view as its route answers it, on one data line."""
    data = jsonable_encoder(view)
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _changed_or_keepalive(subscription: Subscription, state: AdminState) -> bool:
    """Wait for a change (True) or the keepalive's time (False), on the state's clock."""
    change = asyncio.ensure_future(subscription.wait())
    quiet = asyncio.ensure_future(state.clock.sleep(KEEPALIVE_S))
    try:
        await asyncio.wait((change, quiet), return_when=asyncio.FIRST_COMPLETED)
    finally:
        change.cancel()
        quiet.cancel()
    return change.done() and not change.cancelled()


async def event_stream(state: AdminState, authorization: str, kinds: tuple[Kind, ...]) -> AsyncIterator[str]:
    """The frames of one subscriber: every kind at first, then each kind changed, coalesced."""
    leadership = state.leadership
    with state.changes.subscribe() as subscription:
        due: list[Kind] = list(kinds)
        while not subscription.closed:
            caller = state.who.identify(authorization)
            if caller is None:
                return  # the token was revoked or expired: the stream ends with it
            if leadership is not None and not leadership.serving:
                return  # no longer the leader: its views go stale, and a client reconnects to the new one
            readers = _readers(state, caller)
            failed: list[Kind] = []
            for kind in due:
                try:
                    view = await readers[kind]()
                except LlmgwError as error:  # the store away: this kind goes out once it answers
                    log.warning("event %s not sent: %s", kind, error)
                    failed.append(kind)
                    continue
                yield frame(kind, view)
            await state.clock.sleep(COALESCE_S)
            if not subscription.pending and not await _changed_or_keepalive(subscription, state):
                yield KEEPALIVE
            if subscription.closed:
                return  # the control plane stops
            taken = subscription.take()
            due = [k for k in KINDS if k in kinds and (k in taken or k in failed)]


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": EVENTS_DESCRIPTION,
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def events(request: Request, state: State, caller: Who) -> StreamingResponse:
    """A stream of the views that change (server-sent events; see docs/events.md)."""
    stream = event_stream(state, request.headers.get("authorization", ""), readable(caller))
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
