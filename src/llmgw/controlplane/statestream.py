"""The gateway state stream: the leader sends its gateway's state to each standby, which serves /v1 from it.

Over one stream (a :data:`~llmgw.protocol.channels.StateChannel`: gRPC on
the agent port in production, :func:`~llmgw.protocol.channels.memory_state_pair`
in tests):

- the leader (:class:`StateServing`) sends a full copy of its
  :class:`~llmgw.controlplane.gatewaystate.GatewayState`, ending with
  ``live``, then every change as its feed is told it;
- the standby (:class:`StateFollowing`) sends back what only the leader
  decides or writes: its gateway's usage (the leader writes it), summed per
  key, model and place and sent once per :data:`~llmgw.controlplane.localchannel.TICK_S`
  as its gateway workers send theirs (``usage_sums``,
  :class:`~llmgw.controlplane.usage_writing.UsageSums`), tokens counted
  against limits (``controlplane/limit_counting.py``; they also weigh the
  limits' shares, ``controlplane/limit_sharing.py``), models wanted on
  demand or kept in use (``used``: once per model and tick), replicas it
  could not reach.

The leader answers only a certificate naming a control plane the store lists,
and only while it leads (it ends the stream when it stops leading). A standby
that loses the stream keeps its copy and keeps serving from it (the replicas
still answer) and connects again to whichever plane leads next, which sends a
new full copy. The standby keeps its requests while no stream is up (its usage
as sums, however many requests) and sends them on the next; if it comes to
lead itself it hands them to its own parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.controlplane.gatewaystate import Event, GatewayState, StateApplier
from llmgw.controlplane.leadership import Leadership
from llmgw.controlplane.localchannel import TICK_S
from llmgw.controlplane.usage_writing import UsageSums
from llmgw.core.relays import RelayPeer
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.gateway.adapters import Adapters
from llmgw.gateway.usage import UsageRecord
from llmgw.protocol.channels import StateChannel
from llmgw.runtime.waiting import wait_event, within

log = logging.getLogger(__name__)

Connect = Callable[[str], Awaitable[StateChannel]]
"""Opens a state stream to the control plane whose agent server is at the given address."""
OnRequest = Callable[[Event], None]
"""What the leader does with a standby's request (usage, counted, wanted, used, replica_failed)."""

RETRY_S = 0.2
"""How soon a standby whose stream ended tries the leader again."""
PENDING_MAX = 100_000
"""Requests a standby keeps while no stream is up; past that the oldest are dropped."""
CHECK_S = 0.5
"""How often the leader's sending checks that it still leads while no change comes."""


_USAGE_FIELDS = tuple(f.name for f in dataclasses.fields(UsageRecord))


def usage_request(record: UsageRecord) -> Event:
    """One request's usage, sent on (once per request: the fields read directly, as ``asdict``'s deep
    copy cost a gateway worker about 2 % of its time)."""
    return {"kind": "usage", "record": {name: getattr(record, name) for name in _USAGE_FIELDS}}


def usage_record(request: Event) -> UsageRecord:
    return UsageRecord(**request["record"])


class StateServing:
    """The leader's side: a full copy and the changes to each standby, its requests to ``on_request``."""

    def __init__(
        self,
        state: GatewayState,
        leadership: Leadership,
        on_request: OnRequest,
        on_follower: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._state = state
        self._leadership = leadership
        self._on_request = on_request
        self._on_follower = on_follower
        """Told a standby's name when it starts following (True, before its full copy) and stops."""

    async def serve(self, peer: RelayPeer, channel: StateChannel) -> None:
        listed = {plane.name for plane in self._leadership.control_planes}
        if not peer.control_plane or peer.name not in listed:
            log.warning("refused a gateway state stream to certificate %r", peer.name)
            kind = "names no control plane the store lists" if peer.control_plane else "is a node's"
            raise Unauthorized(
                f"the certificate {peer.name!r} {kind}",
                "only control planes follow the gateway's state; add one with 'llmgw server add'",
            )
        if not self._leadership.serving:
            raise NotLeader(f"control plane {self._leadership.me.name} does not lead", "ask the leader")
        if self._on_follower is not None:
            self._on_follower(peer.name, True)  # the limits' shares count it in before its copy
        copy, queue = self._state.subscribe()
        log.info("streaming the gateway's state to %s (%d events in the full copy)", peer.name, len(copy))
        sending = asyncio.ensure_future(self._send(channel, copy, queue))
        taking = asyncio.ensure_future(self._take(channel))
        try:
            await asyncio.wait({sending, taking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._state.unsubscribe(queue)
            if self._on_follower is not None:
                self._on_follower(peer.name, False)
            for task in (sending, taking):
                task.cancel()
            await asyncio.wait({sending, taking})
            await channel.close()

    async def _send(self, channel: StateChannel, copy: list[Event], queue: asyncio.Queue[Event]) -> None:
        with contextlib.suppress(ChannelClosed):
            for event in copy:
                await channel.send(event)
            while self._leadership.serving:
                try:
                    event = await within(queue.get(), CHECK_S)
                except TimeoutError:
                    continue
                if event["kind"] == "overflow":
                    return
                await channel.send(event)

    async def _take(self, channel: StateChannel) -> None:
        with contextlib.suppress(ChannelClosed):
            while True:
                request = await channel.receive()
                try:
                    self._on_request(request)
                except (KeyError, TypeError, ValueError) as error:
                    log.warning("a standby sent a request that makes no sense (%s): %r", error, request)


class StateFollowing:
    """The standby's side: follow whichever plane leads, keep the copy, send the requests.

    :attr:`live` is True while this plane does not lead and holds a full copy
    (from the first one received on): it then serves ``/v1`` itself.
    """

    def __init__(
        self, state: GatewayState, leadership: Leadership, connect: Connect, on_request: OnRequest
    ) -> None:
        self._applier = StateApplier(state)
        self._leadership = leadership
        self._connect = connect
        self._on_request = on_request
        self._pending: list[Event] = []
        self._usage = UsageSums()
        self._used: set[str] = set()
        self._more = asyncio.Event()
        self.connected = False

    @property
    def live(self) -> bool:
        return self._applier.holds_copy and not self._leadership.serving

    def request(self, request: Event) -> None:
        """Send ``request`` to the leader (kept until a stream is up; done here when this plane leads)."""
        if self._leadership.serving:
            self._on_request(request)
            return
        if len(self._pending) >= PENDING_MAX:
            del self._pending[0]
            log.warning("more than %d requests wait for a leader: the oldest was dropped", PENDING_MAX)
        self._pending.append(request)
        self._more.set()

    def usage(self, record: UsageRecord) -> None:
        """Count a request's usage: summed and sent with the next tick (kept while no stream is up),
        done here at once when this plane leads. A message per request cost the leader a line to read
        and the standby a wake of its sender for each."""
        if self._leadership.serving:
            self._on_request(usage_request(record))
            return
        self._usage.add(record)

    def used(self, model: str) -> None:
        """``model`` kept in use (every request's end says so): sent once per model with the next tick,
        kept while no stream is up; done here at once when this plane leads."""
        if self._leadership.serving:
            self._on_request({"kind": "used", "model": model})
            return
        self._used.add(model)

    def _take_sums(self) -> None:
        """The usage summed and the models used since the last tick, to send with the requests."""
        if self._usage:
            self._pending.append({"kind": "usage_sums", "sums": self._usage.take()})
        if self._used:
            used, self._used = self._used, set()
            self._pending.extend({"kind": "used", "model": model} for model in sorted(used))

    def _hand_over(self) -> None:
        """This plane leads: what waited for a leader is done here."""
        self._take_sums()
        pending, self._pending = self._pending, []
        for request in pending:
            self._on_request(request)

    async def run(self) -> None:
        while True:
            seen = self._leadership.generation
            leader = self._leadership.leader
            if self._leadership.serving:
                self._hand_over()
            elif leader is not None and leader.name != self._leadership.me.name:
                await self._follow(leader.name, leader.agent_address)
                await self._leadership.wait_changed(RETRY_S, seen)
                continue
            await self._leadership.wait_changed(self._leadership.round_s, seen)

    async def _follow(self, name: str, address: str) -> None:
        try:
            channel = await self._connect(address)
        except ChannelClosed as error:
            log.info("cannot follow the gateway's state at %s: %s", name, error.message)
            return
        receiving = asyncio.ensure_future(self._receive(channel))
        sending = asyncio.ensure_future(self._send(channel))
        watching = asyncio.ensure_future(self._leader_changed(name))
        tasks = {receiving, sending, watching}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.connected = False
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            await channel.close()
        if receiving.done() and not receiving.cancelled() and (ended := receiving.exception()) is not None:
            log.info("the gateway state stream from %s ended: %s", name, ended)

    async def _receive(self, channel: StateChannel) -> None:
        while True:
            event = await channel.receive()
            self._applier.apply(event)
            if event["kind"] == "live":
                self.connected = True

    async def _send(self, channel: StateChannel) -> None:
        """Requests as they come, the sums once per tick; a request leaves the queue once sent."""
        while True:
            await wait_event(self._more, TICK_S)
            self._more.clear()
            self._take_sums()
            while self._pending:
                await channel.send(self._pending[0])
                del self._pending[0]

    async def _leader_changed(self, name: str) -> None:
        """Returns once another plane (or this one) leads."""
        while True:
            leader = self._leadership.leader
            if self._leadership.serving or leader is None or leader.name != name:
                if leader is None and not self._leadership.serving:
                    # no one leads for now: the old leader's stream ends by itself if it died
                    await self._leadership.wait_changed(self._leadership.round_s)
                    continue
                return
            await self._leadership.wait_changed(self._leadership.round_s)


def request_dispatcher(
    on_usage: Callable[[UsageRecord], None],
    on_wanted: Callable[[str], None],
    on_used: Callable[[str], None],
    on_replica_failed: Callable[[str, str], None],
    on_counted: Callable[[dict[str, int], str], None],
    on_usage_sums: Callable[[list[list[Any]]], None] | None = None,
) -> OnRequest:
    """The leader's :data:`OnRequest` over its own parts (``usage_sums``: a gateway worker's usage, summed
    per key, model and place, ``controlplane/usage_writing.py``)."""

    def dispatch(request: dict[str, Any]) -> None:
        kind = request["kind"]
        if kind == "usage":
            on_usage(usage_record(request))
        elif kind == "usage_sums" and on_usage_sums is not None:
            sums = request["sums"]
            if not isinstance(sums, list):
                raise TypeError(f"usage sums come as a list, not {sums!r}")
            on_usage_sums(sums)
        elif kind == "wanted":
            on_wanted(request["model"])
        elif kind == "used":
            on_used(request["model"])
        elif kind == "replica_failed":
            on_replica_failed(request["replica_id"], request["reason"])
        elif kind == "counted":
            on_counted({str(s): int(n) for s, n in request["tokens"].items()}, str(request.get("plane", "")))
        else:
            raise ValueError(f"unknown request {kind!r}")

    return dispatch


class RuntimeAdapters:
    """The requests a standby leaves to the leader (a ``LeaderDecides`` of ``relaying.py``): those
    naming an adapter loaded at run time (``max_loaded_adapters``), so that one plane alone decides
    which replica loads which adapter, and none is loaded twice."""

    def __init__(self, adapters: Adapters, body_max: int) -> None:
        self._adapters = adapters
        self.body_max = body_max

    def peek(self) -> bool:
        return self._adapters.any_at_run_time()

    def named_in(self, body: bytes) -> bool:
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return False  # the gateway answers what is wrong with it
        entry = self._adapters.get(model) if isinstance(model, str) else None
        return entry is not None and not entry.at_start


async def drop_inherited(
    state: GatewayState, leadership: Leadership, known: Callable[[], set[str]], grace_s: float
) -> None:
    """A plane that comes to lead serves, meanwhile, the replicas the old leader's stream named; once
    it has led for ``grace_s`` (nodes had time to register again), those its own fleet does not know
    (``known``: replica ids) are told gone (the fleet itself tells of those it knows)."""
    while True:
        seen = leadership.generation
        if not leadership.serving:
            await leadership.wait_changed(leadership.round_s, seen)
            continue
        await leadership.wait_changed(grace_s, seen)
        if leadership.generation == seen and leadership.serving:
            for replica_id in sorted(state.replica_ids - known()):
                log.info("replica %s, inherited from the last leader, did not come back: dropped", replica_id)
                state.feed.replica_gone(replica_id)
            while leadership.serving:
                await leadership.wait_changed(leadership.round_s)
