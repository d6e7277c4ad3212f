"""The gateway's state as typed change events: recorded on one plane, applied on another.

Every change a gateway is told comes through its
:class:`~llmgw.gateway.feeding.GatewayFeed`. :class:`GatewayState` listens to
a feed and keeps what it was told (ready replicas with their addresses, keys
and engines; the catalog; the API keys and their places; the limits, the
planes' shares of them and their counts; each replica's KV blocks; the stopped flag) as
events, so that it can give, at any moment:

- a **full copy** (:meth:`GatewayState.full_copy`): the events that bring an
  empty or stale gateway to the same state, from :class:`~llmgw.controlplane.statesharing.stateevents.Copy`
  to :class:`~llmgw.controlplane.statesharing.stateevents.Live`;
- the **changes** from then on, to every subscriber's queue
  (:meth:`GatewayState.subscribe`).

:func:`change_event` turns a feed's change into its event
(:mod:`llmgw.controlplane.statesharing.stateevents`, which also holds the one codec), and
:func:`apply` plays one into another feed. The server and the follower that
carry them are in :mod:`llmgw.controlplane.statesharing.stateprotocol`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Final

from llmgw.controlplane.statesharing.stateevents import (
    CatalogReplaced,
    Copy,
    KeysReplaced,
    KvBlocks,
    LimitsCounted,
    LimitsReplaced,
    LimitsShared,
    Live,
    PricesReplaced,
    ReplicaDraining,
    ReplicaGone,
    ReplicaReady,
    ServerEvent,
    StateChange,
    StoppedSet,
)
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.gateway.feeding import GatewayFeed

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000
"""Changes a subscriber may fall behind by; past that it is dropped (it reconnects and gets a full copy)."""


class Overflow:
    """Put last in the queue of a subscriber that fell :data:`QUEUE_MAX` changes behind: it was dropped
    (its server ends the stream; the follower connects again and takes a full copy)."""

    def __repr__(self) -> str:
        return "OVERFLOW"


OVERFLOW: Final = Overflow()

Queued = StateChange | Overflow
"""What a subscriber's queue holds."""


def change_event(change: str, args: tuple[Any, ...]) -> StateChange:
    """A feed's change (its method's name and arguments, :meth:`GatewayFeed.listen`) as an event."""
    if change == "replica_ready":
        endpoint, paths = args
        return ReplicaReady(endpoint, dict(paths))
    if change == "replica_gone":
        return ReplicaGone(args[0])
    if change == "replica_draining":
        return ReplicaDraining(args[0])
    if change == "catalog_replaced":
        return CatalogReplaced(tuple(args[0]))
    if change == "keys_replaced":
        return KeysReplaced(tuple(args[0]))
    if change == "limits_replaced":
        return LimitsReplaced(dict(args[0]))
    if change == "prices_replaced":
        return PricesReplaced(args[0])
    if change == "limits_shared":
        return LimitsShared(args[0])
    if change == "limits_counted":
        return LimitsCounted(dict(args[0]))
    if change == "kv_blocks":
        return KvBlocks(args[0])
    if change == "set_stopped":
        return StoppedSet(bool(args[0]))
    raise ValueError(f"the gateway feed has no change {change!r}")


def apply(event: StateChange, feed: GatewayFeed) -> None:
    """Play one change into ``feed``."""
    match event:
        case ReplicaReady(endpoint, paths):
            feed.replica_ready(endpoint, paths)
        case ReplicaGone(replica_id):
            feed.replica_gone(replica_id)
        case ReplicaDraining(replica_id):
            feed.replica_draining(replica_id)
        case CatalogReplaced(models):
            feed.catalog_replaced(models)
        case KeysReplaced(keys):
            feed.keys_replaced(keys)
        case LimitsReplaced(limits):
            feed.limits_replaced(limits)
        case PricesReplaced(prices):
            feed.prices_replaced(prices)
        case LimitsShared(shares):
            feed.limits_shared(shares)
        case LimitsCounted(used):
            feed.limits_counted(used)
        case KvBlocks(update):
            feed.kv_blocks(update)
        case StoppedSet(stopped):
            feed.set_stopped(stopped)
        case _:
            raise ValueError(f"{event!r} is no change of a gateway's state")


class GatewayState:
    """What a feed was told, kept as events: a full copy on demand, and the changes to subscribers."""

    def __init__(self, feed: GatewayFeed) -> None:
        self.feed = feed
        self._replicas: dict[str, ReplicaReady] = {}
        self._draining: set[str] = set()
        self._whole: dict[str, StateChange] = {}
        """The last event of each kind that replaces a whole (catalog, keys, limits, counts, stopped)."""
        self._kv: dict[str, tuple[KvBlocksUpdate, set[int]]] = {}
        """Per replica: its hashing (the last update, blocks left out) and the blocks it holds."""
        self._subscribers: list[asyncio.Queue[Queued]] = []
        feed.listen(self._told)

    @property
    def replica_ids(self) -> set[str]:
        """The replicas the feed was told of and not told gone (draining ones included)."""
        return set(self._replicas)

    def _told(self, change: str, args: tuple[Any, ...]) -> None:
        event = change_event(change, args)
        self._keep(event)
        for queue in list(self._subscribers):
            if queue.qsize() >= QUEUE_MAX:
                log.warning("a gateway state subscriber fell %d changes behind: dropped", QUEUE_MAX)
                self._subscribers.remove(queue)
                queue.put_nowait(OVERFLOW)
                continue
            queue.put_nowait(event)

    def _keep(self, event: StateChange) -> None:
        match event:
            case ReplicaReady(endpoint):
                self._replicas[endpoint.replica_id] = event
                self._draining.discard(endpoint.replica_id)
            case ReplicaGone(replica_id):
                self._replicas.pop(replica_id, None)
                self._draining.discard(replica_id)
                self._kv.pop(replica_id, None)
            case ReplicaDraining(replica_id):
                self._draining.add(replica_id)
            case KvBlocks(update):
                hashing, held = self._kv.get(update.replica_id, (update, set()))
                if update.reset:
                    held = set()
                held.update(update.stored)
                held.difference_update(update.removed)
                hashing = dataclasses.replace(update, stored=(), removed=(), reset=True)
                self._kv[update.replica_id] = (hashing, held)
            case _:
                self._whole[event.kind] = event

    def full_copy(self) -> list[ServerEvent]:
        """Events that bring a gateway to this state from any other: a receiver first forgets the
        replicas the copy does not name (:class:`StateApplier`), then plays these; ``Live`` last."""
        events: list[ServerEvent] = [Copy(tuple(sorted(self._replicas))), *self._whole.values()]
        for replica_id, ready in self._replicas.items():
            events.append(ready)
            if replica_id in self._draining:
                events.append(ReplicaDraining(replica_id))
        for hashing, held in self._kv.values():
            events.append(KvBlocks(dataclasses.replace(hashing, stored=tuple(sorted(held)))))
        events.append(Live())
        return events

    def subscribe(self) -> tuple[list[ServerEvent], asyncio.Queue[Queued]]:
        """A full copy and, from the same instant, a queue of every change after it."""
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        self._subscribers.append(queue)
        return self.full_copy(), queue

    def unsubscribe(self, queue: asyncio.Queue[Queued]) -> None:
        if queue in self._subscribers:
            self._subscribers.remove(queue)


class StateApplier:
    """A following side's part: plays a server's full copy and changes into its own feed.

    A :class:`Copy` starts a full copy: the replicas it does not name are told
    gone first (the old leader's view may hold replicas the new one lost). The
    follower holds a full copy from the first :class:`Live` on, and keeps it (it
    keeps routing with it) when the stream ends.
    """

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self.holds_copy = False

    def apply(self, event: StateChange | Copy | Live) -> None:
        match event:
            case Copy(replica_ids):
                for replica_id in self._state.replica_ids - set(replica_ids):
                    self._state.feed.replica_gone(replica_id)
            case Live():
                self.holds_copy = True
            case _:
                apply(event, self._state.feed)
