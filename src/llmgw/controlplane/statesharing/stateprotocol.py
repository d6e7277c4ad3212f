"""The gateway state protocol's one server and one follower, over any state channel.

The same protocol runs between two pairs (its events and codec:
:mod:`llmgw.controlplane.statesharing.stateevents`):

==================  ==================================  =====================================
                    the leader to its standbys          a control plane to its gateway workers
==================  ==================================  =====================================
channel             gRPC, mutual TLS                    a Unix socket in the data dir (0600)
the server's part   ``statestream.StateServing``        ``localchannel.WorkerChannelServer``
the follower's      ``statestream.StateFollowing``      ``localchannel.WorkerFollowing``
==================  ==================================  =====================================

:class:`StateServer` publishes a :class:`~llmgw.controlplane.statesharing.gatewaystate.GatewayState`
to any number of followers: to each, on connecting, a full copy (``Copy``,
the state, ``Live``), then every change as the state is told it, with what
its :class:`ServerPart` adds every ``tick_s`` (a worker's ``Serves`` and limit
counts); a follower that falls :data:`~llmgw.controlplane.statesharing.gatewaystate.QUEUE_MAX`
changes behind has a gap: its stream is ended, and it takes a new full copy on
connecting again. The requests a follower sends go to the part (one that
makes no sense is logged and skipped; the stream goes on). The stream also ends
when the part says so (a leader that stops leading).

:class:`StateFollower` applies a server's copy and changes to its own state
(:class:`~llmgw.controlplane.statesharing.gatewaystate.StateApplier`) and sends its
requests: those it is given as they come (kept while no stream is up, at
most :data:`PENDING_MAX`, the oldest dropped past that, and sent on the next
stream: it resumes), its usage summed per key, model and place and the models
kept in use once per :data:`TICK_S`. A frame it cannot read ends the stream
(a follower never guesses at state: it resyncs from a new full copy). Once a
stream ends it keeps its copy (its gateway keeps serving from it) and
:meth:`StateFollower.run` connects again with backoff; a standby instead
follows whichever plane leads (``statestream.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.controlplane.accounting.usage_writing import UsageSums
from llmgw.controlplane.statesharing.gatewaystate import GatewayState, Overflow, Queued, StateApplier
from llmgw.controlplane.statesharing.stateevents import (
    BadFrame,
    Copy,
    Live,
    Request,
    ServerEvent,
    StateChange,
    UsageSummed,
    Used,
    decode,
    encode,
)
from llmgw.core.backoff import Backoff
from llmgw.errors import ChannelClosed
from llmgw.gateway.usage import UsageRecord
from llmgw.protocol.channels import StateChannel
from llmgw.runtime.waiting import wait_event, within

log = logging.getLogger(__name__)

TICK_S = 0.2
"""How often a follower sends its sums, and a worker's server looks whether it serves /v1 itself."""
PENDING_MAX = 100_000
"""Requests a follower keeps while no stream is up; past that the oldest are dropped."""
FRAMES_KEPT = 4096
"""Encoded events a server keeps for its other followers."""


# -- the server ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class Follower:
    """One follower connected to a :class:`StateServer`, as its part sees it."""

    name: str
    """Who it is: a standby's certificate name, a worker's pid as the kernel says."""
    channel: StateChannel = field(repr=False)


class ServerPart(Protocol):
    """What a server's user adds to the protocol: who may follow, what else each is told, what is done
    with their requests."""

    def joined(self, follower: Follower) -> None:
        """``follower`` connected; its full copy follows."""

    def left(self, follower: Follower) -> None:
        """``follower``'s stream ended."""

    def take(self, follower: Follower, request: Request) -> None:
        """A request ``follower`` sent; KeyError, TypeError or ValueError when it makes no sense."""

    def tick(self, follower: Follower) -> Sequence[ServerEvent]:
        """What else ``follower`` is sent, after its full copy and once per tick."""

    def going(self) -> bool:
        """Whether the streams go on (False ends them: a leader that stopped leading)."""


class StateServer:
    """Publishes ``state`` to every follower that connects; see the module's text."""

    def __init__(self, state: GatewayState, part: ServerPart, tick_s: float = TICK_S) -> None:
        self._state = state
        self._part = part
        self._tick_s = tick_s
        self.followers: set[Follower] = set()
        """The followers connected now."""
        self._frames: dict[int, tuple[ServerEvent, bytes]] = {}
        """The last events encoded, by identity: each change (and each part of a full copy kept in
        the state) is encoded once for all followers."""

    async def serve(self, channel: StateChannel, name: str) -> None:
        """Publish to the follower at the other end of ``channel`` until either side ends the stream."""
        follower = Follower(name, channel)
        self.followers.add(follower)
        self._part.joined(follower)
        copy, queue = self._state.subscribe()
        log.debug("publishing the gateway's state to %s (%d events in the full copy)", name, len(copy))
        sending = asyncio.ensure_future(self._send(follower, copy, queue))
        taking = asyncio.ensure_future(self._take(follower))
        try:
            await asyncio.wait({sending, taking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._state.unsubscribe(queue)
            self.followers.discard(follower)
            self._part.left(follower)
            for task in (sending, taking):
                task.cancel()
            await asyncio.wait({sending, taking})
            await channel.close()

    def _frame(self, event: ServerEvent) -> bytes:
        cached = self._frames.get(id(event))
        if cached is not None and cached[0] is event:
            return cached[1]
        frame = encode(event)
        if len(self._frames) >= FRAMES_KEPT:
            del self._frames[next(iter(self._frames))]
        self._frames[id(event)] = (event, frame)  # the event is held: its id is not reused meanwhile
        return frame

    async def tell(self, follower: Follower, event: ServerEvent) -> None:
        """Send ``follower`` one event now (a worker asked for its metrics); nothing if its stream ended."""
        with contextlib.suppress(ChannelClosed):
            await follower.channel.send(encode(event))

    async def _send(self, follower: Follower, copy: list[ServerEvent], queue: asyncio.Queue[Queued]) -> None:
        channel = follower.channel
        with contextlib.suppress(ChannelClosed):
            for event in (*copy, *self._part.tick(follower)):
                await channel.send(self._frame(event))
            while self._part.going():
                try:
                    queued = await within(queue.get(), self._tick_s)
                except TimeoutError:
                    queued = None
                while queued is not None:  # a burst goes out at once
                    if isinstance(queued, Overflow):
                        log.info("%s fell behind the gateway's state: its stream ends", follower.name)
                        return  # it connects again and takes a new full copy
                    await channel.send(self._frame(queued))
                    queued = queue.get_nowait() if not queue.empty() else None
                for event in self._part.tick(follower):
                    await channel.send(encode(event))

    async def _take(self, follower: Follower) -> None:
        with contextlib.suppress(ChannelClosed):
            while True:
                frame = await follower.channel.receive()
                try:
                    request = decode(frame)
                    if isinstance(request, ServerEvent):
                        raise ValueError(f"{request.kind} is the server's to send")
                    self._part.take(follower, request)
                except BadFrame as error:
                    log.warning("%s sent a frame that cannot be read: %s", follower.name, error)
                except (KeyError, TypeError, ValueError) as error:
                    log.warning("%s sent a request that makes no sense (%s): %r", follower.name, error, frame)


# -- the follower -------------------------------------------------------------------------------------


class FollowerPart(Protocol):
    """What a follower's user adds: what the server's other events mean, what else goes with each tick."""

    def told(self, event: ServerEvent) -> None:
        """An event of the server's that is no state (``Serves``, ``SendMetrics``)."""

    def tick(self) -> Iterable[Request]:
        """What else goes to the server with this tick's requests."""


class _NoMore:
    def told(self, event: ServerEvent) -> None:
        log.warning("the state server sent %s, which this follower does not take", event.kind)

    def tick(self) -> Iterable[Request]:
        return ()


class StateFollower:
    """Follows a server's state into ``state``: applies its copy and changes, sends the requests.

    :attr:`holds_copy` is True from the first full copy on (kept when a stream
    ends); :attr:`connected` while a stream is up and its full copy was taken in.
    """

    def __init__(
        self, state: GatewayState, part: FollowerPart | None = None, what: str = "the server"
    ) -> None:
        self._applier = StateApplier(state)
        self._part = part or _NoMore()
        self._what = what
        """The server, as the logs name it."""
        self._pending: collections.deque[Request] = collections.deque()
        self._usage = UsageSums()
        self._used: set[str] = set()
        self._more = asyncio.Event()
        self.connected = False
        self.connections = 0
        """Streams opened so far (each began with a full copy)."""

    @property
    def holds_copy(self) -> bool:
        return self._applier.holds_copy

    def request(self, request: Request) -> None:
        """Send ``request`` to the server (kept until a stream is up)."""
        if len(self._pending) >= PENDING_MAX:
            self._pending.popleft()
            log.warning("more than %d requests wait for %s: the oldest was dropped", PENDING_MAX, self._what)
        self._pending.append(request)
        self._more.set()

    def usage(self, record: UsageRecord) -> None:
        """Count a request's usage: summed and sent with the next tick (kept while no stream is up). A
        message per request cost the server a fifth of its time reading them at thousands of requests a
        second, and waking the sender for each a tenth of the follower's."""
        self._usage.add(record)

    def used(self, model: str) -> None:
        """``model`` kept in use (every request's end says so): sent once per model with the next tick,
        kept while no stream is up."""
        self._used.add(model)

    def wake(self) -> None:
        """Send what waits now, not at the next tick."""
        self._more.set()

    def take_all(self) -> list[Request]:
        """Everything that waits to be sent, this tick's sums included, taken out (a standby that comes
        to lead does them itself)."""
        self._take_sums()
        pending = list(self._pending)
        self._pending.clear()
        return pending

    def _take_sums(self) -> None:
        if self._usage:
            self._pending.append(UsageSummed(tuple(tuple(row) for row in self._usage.take())))
        if self._used:
            used, self._used = self._used, set()
            self._pending.extend(Used(model) for model in sorted(used))

    async def run(
        self,
        connect: Callable[[], Awaitable[StateChannel]],
        backoff: Backoff,
        first: Callable[[], Sequence[Request]] = tuple,
    ) -> None:
        """Follow until cancelled, connecting again with ``backoff`` whenever a stream ends; ``first``:
        what goes first on each stream."""
        while True:
            try:
                channel = await connect()
            except ChannelClosed as error:
                delay = backoff.next_delay()
                log.info("cannot follow %s (%s): again in %.2f s", self._what, error.message, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            await self.follow(channel, first())
            log.info("the state stream from %s ended: connecting again", self._what)
            await asyncio.sleep(backoff.next_delay())

    async def follow(
        self, channel: StateChannel, first: Sequence[Request] = (), until: Awaitable[None] | None = None
    ) -> None:
        """Follow over ``channel`` until its stream ends (or ``until`` is done); then close it."""
        self.connections += 1
        self._pending.extendleft(reversed(first))
        self._more.set()
        receiving = asyncio.ensure_future(self._receive(channel))
        tasks = {receiving, asyncio.ensure_future(self._send(channel))}
        if until is not None:
            tasks.add(asyncio.ensure_future(until))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.connected = False
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            await channel.close()
        if receiving.done() and not receiving.cancelled() and (ended := receiving.exception()) is not None:
            log.info("the state stream from %s ended: %s", self._what, ended)

    async def _receive(self, channel: StateChannel) -> None:
        while True:
            frame = await channel.receive()
            try:
                event = decode(frame)
            except BadFrame as error:
                log.warning(
                    "%s sent a frame that cannot be read, taking a new full copy: %s", self._what, error
                )
                raise
            if isinstance(event, StateChange | Copy | Live):
                self._applier.apply(event)
                if isinstance(event, Live):
                    self.connected = True
            elif isinstance(event, ServerEvent):
                self._part.told(event)
            else:
                log.warning("%s sent %s, a follower's request: skipped", self._what, event.kind)

    async def _send(self, channel: StateChannel) -> None:
        """Requests as they come, the sums once per tick; a request leaves the queue once sent."""
        while True:
            await wait_event(self._more, TICK_S)
            self._more.clear()
            self._pending.extend(self._part.tick())
            self._take_sums()
            while self._pending:
                await channel.send(encode(self._pending[0]))
                self._pending.popleft()
