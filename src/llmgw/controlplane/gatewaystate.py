"""The gateway's state as serialisable change events: recorded on one plane, applied on another.

Every change a gateway is told comes through its
:class:`~llmgw.gateway.feeding.GatewayFeed`. :class:`GatewayState` listens to
a feed and keeps what it was told (ready replicas with their addresses, keys
and engines; the catalog; the API keys and their places; the limits, the
planes' shares of them and their counts; each replica's KV blocks; the stopped flag) as plain data, so that it
can give, at any moment:

- a **full copy** (:meth:`GatewayState.full_copy`): the events that bring an
  empty or stale gateway to the same state, ending with ``{"kind": "live"}``;
- the **changes** from then on, to every subscriber's queue
  (:meth:`GatewayState.subscribe`).

:func:`apply` plays one event into another feed. An event is a JSON-ready
``dict`` with a ``kind`` (the feed's method) and that method's arguments;
:func:`encode` and :func:`apply` are the only places that know the shapes.
The stream that carries them is :mod:`llmgw.controlplane.statestream`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from llmgw.core.catalog import ModelDefinition
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.limits import Limits
from llmgw.core.limitshares import PlaneShares
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.replicas import ReplicaEndpoint

log = logging.getLogger(__name__)

Event = dict[str, Any]

LIVE: Event = {"kind": "live"}
"""Ends a full copy: the receiver now holds the sender's whole state."""

QUEUE_MAX = 10_000
"""Changes a subscriber may fall behind by; past that it is dropped (it reconnects and gets a full copy)."""


def _endpoint(endpoint: ReplicaEndpoint) -> dict[str, Any]:
    return {
        "replica_id": endpoint.replica_id,
        "model": endpoint.model,
        "base_url": endpoint.base_url,
        "api_key": endpoint.api_key,
        "capacity": endpoint.capacity,
        "engine": endpoint.engine,
    }


def _key(entry: KeyEntry) -> dict[str, Any]:
    return {
        "key_id": entry.key_id,
        "name": entry.name,
        "secret_hash": entry.secret_hash,
        "owner": entry.owner,
        "at": str(entry.place.at),
        "memberships": sorted(str(owner) for owner in entry.place.memberships),
        "collections": list(entry.collections),
    }


def _key_entry(data: Mapping[str, Any]) -> KeyEntry:
    place = Place(Owner.parse(data["at"]), frozenset(Owner.parse(text) for text in data["memberships"]))
    collections = tuple(data.get("collections", ()))  # absent from a peer of an earlier version
    return KeyEntry(data["key_id"], data["name"], data["secret_hash"], data["owner"], place, collections)


def _kv(update: KvBlocksUpdate) -> dict[str, Any]:
    return {
        "model": update.model,
        "replica_id": update.replica_id,
        "stored": list(update.stored),
        "removed": list(update.removed),
        "reset": update.reset,
        "hash_seed": update.hash_seed,
        "block_size": update.block_size,
    }


def encode(change: str, args: tuple[Any, ...]) -> Event:
    """A feed's change (its method's name and arguments) as an event."""
    if change == "replica_ready":
        endpoint, paths = args
        return {"kind": change, "endpoint": _endpoint(endpoint), "adapter_paths": dict(paths)}
    if change in ("replica_gone", "replica_draining"):
        return {"kind": change, "replica_id": args[0]}
    if change == "catalog_replaced":
        return {"kind": change, "models": [m.model_dump(mode="json") for m in args[0]]}
    if change == "keys_replaced":
        return {"kind": change, "keys": [_key(k) for k in args[0]]}
    if change == "limits_replaced":
        return {"kind": change, "limits": {s: lim.as_dict() for s, lim in args[0].items()}}
    if change == "limits_shared":
        return {"kind": change, "shares": args[0].as_dict()}
    if change == "limits_counted":
        return {"kind": change, "used": {s: list(pair) for s, pair in args[0].items()}}
    if change == "kv_blocks":
        return {"kind": change, "update": _kv(args[0])}
    if change == "set_stopped":
        return {"kind": change, "stopped": bool(args[0])}
    raise ValueError(f"the gateway feed has no change {change!r}")


def apply(event: Event, feed: GatewayFeed) -> None:
    """Play one event into ``feed`` (``live`` changes nothing: :class:`GatewayState` marks it)."""
    kind = event["kind"]
    if kind == "replica_ready":
        feed.replica_ready(ReplicaEndpoint(**event["endpoint"]), event["adapter_paths"])
    elif kind == "replica_gone":
        feed.replica_gone(event["replica_id"])
    elif kind == "replica_draining":
        feed.replica_draining(event["replica_id"])
    elif kind == "catalog_replaced":
        feed.catalog_replaced(ModelDefinition.model_validate(m) for m in event["models"])
    elif kind == "keys_replaced":
        feed.keys_replaced(_key_entry(k) for k in event["keys"])
    elif kind == "limits_replaced":
        feed.limits_replaced({s: Limits.from_dict(d) for s, d in event["limits"].items()})
    elif kind == "limits_shared":
        feed.limits_shared(PlaneShares.from_dict(event["shares"]))
    elif kind == "limits_counted":
        feed.limits_counted({s: (int(p[0]), int(p[1])) for s, p in event["used"].items()})
    elif kind == "kv_blocks":
        u = event["update"]
        feed.kv_blocks(KvBlocksUpdate(**{**u, "stored": tuple(u["stored"]), "removed": tuple(u["removed"])}))
    elif kind == "set_stopped":
        feed.set_stopped(event["stopped"])
    elif kind != "live":
        raise ValueError(f"unknown gateway state event {kind!r}")


class GatewayState:
    """What a feed was told, kept as events: a full copy on demand, and the changes to subscribers."""

    def __init__(self, feed: GatewayFeed) -> None:
        self.feed = feed
        self._replicas: dict[str, Event] = {}
        self._draining: set[str] = set()
        self._whole: dict[str, Event] = {}
        """The last event of each kind that replaces a whole (catalog, keys, limits, counts, stopped)."""
        self._kv: dict[str, tuple[Event, set[int]]] = {}
        """Per replica: its hashing (the last update, blocks left out) and the blocks it holds."""
        self._subscribers: list[asyncio.Queue[Event]] = []
        feed.listen(self._told)

    @property
    def replica_ids(self) -> set[str]:
        """The replicas the feed was told of and not told gone (draining ones included)."""
        return set(self._replicas)

    def _told(self, change: str, args: tuple[Any, ...]) -> None:
        event = encode(change, args)
        self._keep(event)
        for queue in list(self._subscribers):
            if queue.qsize() >= QUEUE_MAX:
                log.warning("a gateway state subscriber fell %d changes behind: dropped", QUEUE_MAX)
                self._subscribers.remove(queue)
                queue.put_nowait({"kind": "overflow"})
                continue
            queue.put_nowait(event)

    def _keep(self, event: Event) -> None:
        kind = event["kind"]
        if kind == "replica_ready":
            replica_id = event["endpoint"]["replica_id"]
            self._replicas[replica_id] = event
            self._draining.discard(replica_id)
        elif kind == "replica_gone":
            self._replicas.pop(event["replica_id"], None)
            self._draining.discard(event["replica_id"])
            self._kv.pop(event["replica_id"], None)
        elif kind == "replica_draining":
            self._draining.add(event["replica_id"])
        elif kind == "kv_blocks":
            update = event["update"]
            hashing, held = self._kv.get(update["replica_id"], ({}, set()))
            if update["reset"]:
                held = set()
            held.update(update["stored"])
            held.difference_update(update["removed"])
            hashing = {**update, "stored": [], "removed": [], "reset": True}
            self._kv[update["replica_id"]] = (hashing, held)
        else:
            self._whole[kind] = event

    def full_copy(self) -> list[Event]:
        """Events that bring a gateway to this state from any other: a receiver first forgets the
        replicas the copy does not name (:class:`StateApplier`), then plays these; ``live`` last."""
        events: list[Event] = [
            {"kind": "copy", "replica_ids": sorted(self._replicas)},
            *self._whole.values(),
        ]
        for replica_id, ready in self._replicas.items():
            events.append(ready)
            if replica_id in self._draining:
                events.append({"kind": "replica_draining", "replica_id": replica_id})
        for hashing, held in self._kv.values():
            events.append({"kind": "kv_blocks", "update": {**hashing, "stored": sorted(held)}})
        events.append(LIVE)
        return events

    def subscribe(self) -> tuple[list[Event], asyncio.Queue[Event]]:
        """A full copy and, from the same instant, a queue of every change after it."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers.append(queue)
        return self.full_copy(), queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        if queue in self._subscribers:
            self._subscribers.remove(queue)


class StateApplier:
    """A receiving plane's side: plays a leader's full copy and changes into its own feed.

    A ``copy`` event starts a full copy: the replicas it does not name are told
    gone first (the old leader's view may hold replicas the new one lost). The
    receiver holds a full copy from the first ``live`` on, and keeps it (it
    keeps routing with it) when the stream ends.
    """

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self.holds_copy = False

    def apply(self, event: Event) -> None:
        kind = event["kind"]
        if kind == "copy":
            for replica_id in self._state.replica_ids - set(event["replica_ids"]):
                self._state.feed.replica_gone(replica_id)
            return
        if kind == "live":
            self.holds_copy = True
            return
        apply(event, self._state.feed)
