"""The gateway state stream: the leader sends its gateway's state to each standby, which serves /v1 from it.

The state protocol's server and follower (:mod:`llmgw.controlplane.statesharing.stateprotocol`)
over one stream per standby (a :data:`~llmgw.protocol.channels.StateChannel`:
gRPC with mutual TLS on the agent port in production,
:func:`~llmgw.protocol.channels.memory_state_pair` in tests):

- the leader (:class:`StateServing`) sends a full copy of its
  :class:`~llmgw.controlplane.statesharing.gatewaystate.GatewayState`, ending with
  ``Live``, then every change as its feed is told it;
- the standby (:class:`StateFollowing`) sends back what only the leader
  decides or writes: its gateway's usage (the leader writes it), summed per
  key, model and place and sent once per :data:`~llmgw.controlplane.statesharing.stateprotocol.TICK_S`
  as its gateway workers send theirs (``UsageSummed``,
  :class:`~llmgw.controlplane.accounting.usage_writing.UsageSums`), tokens counted
  against limits (``Counted``: ``controlplane/accounting/limit_counting.py``; they also
  weigh the limits' shares, ``controlplane/accounting/limit_sharing.py``), models wanted
  on demand or kept in use (``Used``: once per model and tick), replicas it
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

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llmgw.controlplane.lifecycle.leadership import Leadership
from llmgw.controlplane.statesharing.gatewaystate import GatewayState
from llmgw.controlplane.statesharing.stateevents import (
    Counted,
    ReplicaFailed,
    Request,
    ServerEvent,
    Usage,
    UsageSummed,
    Used,
    Wanted,
)
from llmgw.controlplane.statesharing.stateprotocol import Follower, StateFollower, StateServer
from llmgw.core.relays import RelayPeer
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.gateway.adapters import Adapters
from llmgw.gateway.usage import UsageRecord
from llmgw.protocol.channels import StateChannel

log = logging.getLogger(__name__)

Connect = Callable[[str], Awaitable[StateChannel]]
"""Opens a state stream to the control plane whose agent server is at the given address."""
OnRequest = Callable[[Request], None]
"""What the leader does with a standby's request (usage, counted, wanted, used, replica_failed)."""

RETRY_S = 0.2
"""How soon a standby whose stream ended tries the leader again."""
CHECK_S = 0.5
"""How often the leader's sending checks that it still leads while no change comes."""


class StateServing:
    """The leader's side: a full copy and the changes to each standby, its requests to ``on_request``."""

    def __init__(
        self,
        state: GatewayState,
        leadership: Leadership,
        on_request: OnRequest,
        on_follower: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._leadership = leadership
        self._on_request = on_request
        self._on_follower = on_follower
        """Told a standby's name when it starts following (True, before its full copy) and stops."""
        self._server = StateServer(state, self, tick_s=CHECK_S)

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
        log.info("streaming the gateway's state to %s", peer.name)
        await self._server.serve(channel, peer.name)

    # the server's part (stateprotocol.ServerPart)

    def joined(self, follower: Follower) -> None:
        if self._on_follower is not None:
            self._on_follower(follower.name, True)  # the limits' shares count it in before its copy

    def left(self, follower: Follower) -> None:
        if self._on_follower is not None:
            self._on_follower(follower.name, False)

    def take(self, follower: Follower, request: Request) -> None:
        self._on_request(request)

    def tick(self, follower: Follower) -> Sequence[ServerEvent]:
        return ()

    def going(self) -> bool:
        return self._leadership.serving


class StateFollowing:
    """The standby's side: follow whichever plane leads, keep the copy, send the requests.

    :attr:`live` is True while this plane does not lead and holds a full copy
    (from the first one received on): it then serves ``/v1`` itself.
    """

    def __init__(
        self, state: GatewayState, leadership: Leadership, connect: Connect, on_request: OnRequest
    ) -> None:
        self._follower = StateFollower(state, what="the leader")
        self._leadership = leadership
        self._connect = connect
        self._on_request = on_request

    @property
    def live(self) -> bool:
        return self._follower.holds_copy and not self._leadership.serving

    @property
    def connected(self) -> bool:
        """A stream from the leader is up and its full copy was taken in."""
        return self._follower.connected

    def request(self, request: Request) -> None:
        """Send ``request`` to the leader (kept until a stream is up; done here when this plane leads)."""
        if self._leadership.serving:
            self._on_request(request)
        else:
            self._follower.request(request)

    def usage(self, record: UsageRecord) -> None:
        """Count a request's usage: summed and sent with the next tick (kept while no stream is up),
        done here at once when this plane leads. A message per request cost the leader a line to read
        and the standby a wake of its sender for each."""
        if self._leadership.serving:
            self._on_request(Usage(record))
        else:
            self._follower.usage(record)

    def used(self, model: str) -> None:
        """``model`` kept in use (every request's end says so): sent once per model with the next tick,
        kept while no stream is up; done here at once when this plane leads."""
        if self._leadership.serving:
            self._on_request(Used(model))
        else:
            self._follower.used(model)

    async def run(self) -> None:
        while True:
            seen = self._leadership.generation
            leader = self._leadership.leader
            if self._leadership.serving:
                for request in self._follower.take_all():  # what waited for a leader is done here
                    self._on_request(request)
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
        await self._follower.follow(channel, until=self._leader_changed(name))

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
    """The leader's :data:`OnRequest` over its own parts (``UsageSummed``: a standby's or a gateway
    worker's usage, summed per key, model and place, ``controlplane/accounting/usage_writing.py``)."""

    def dispatch(request: Request) -> None:
        match request:
            case Usage(record):
                on_usage(record)
            case UsageSummed() if on_usage_sums is not None:
                on_usage_sums(request.rows())
            case Wanted(model):
                on_wanted(model)
            case Used(model):
                on_used(model)
            case ReplicaFailed(replica_id, reason):
                on_replica_failed(replica_id, reason)
            case Counted(tokens, plane):
                on_counted(dict(tokens), plane)
            case _:
                raise ValueError(f"unknown request {request.kind!r}")

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
