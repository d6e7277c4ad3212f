"""Leadership: take the leader lease, keep it, and say when this control plane leads.

Every round (a third of the lease by default) a control plane announces
itself in the store, then renews the lease it holds or, standing by, asks for
it. Three states follow, each reported once through ``on_change``:

- ``leading``: the lease is held and was renewed within its length by this
  process's own monotonic clock, measured from before the renewal was sent.
  Leader-only work runs (reconciler, agents' streams).
- ``paused``: the lease is still held in the store as far as anyone knows, but
  the store has not answered for a whole lease: leader-only work stops, while
  the agents' streams and the gateway keep serving from memory. The first
  renewal that gets through leads again with the same epoch.
- ``standby``: another control plane leads (or none can be reached); the
  store's fence refuses this process's writes.

Whatever the state says, a control plane serves as leader (answers /leader
200, keeps agents' streams, answers relays) only on fresh evidence measured
on its own monotonic clock: leading, a renewal confirmed less than a lease
ago; paused, a round that saw the store away less than a lease ago. A process
that was frozen (SIGSTOP, a VM paused) past its lease therefore stops serving
the moment it thaws, before its first round tells it another leads.

A standby times its next round to the moment the lease it saw lapses, so a
leader that died silently is replaced one lease after its last renewal.
While the store does not answer, rounds come every second (``OUTAGE_ROUND_S``)
rather than every third of the lease, so a leader renews as soon as the store
is back (a Patroni failover, a server restarted): an outage shorter than the
lease, less that second, never pauses it.
A standby that saw the store out of reach leaves the lease alone for a while
after the store returns (:meth:`Leadership.quiet_after_outage_s`: the store's
timeout, an outage round and a round), so a leader that kept leading through
the outage renews first instead of the lease moving needlessly, even when its
round was waiting on a call the outage left hanging; a leader that died during
the outage is replaced that much later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from llmgw.errors import LlmgwError, StoreError
from llmgw.runtime.waiting import wait_event
from llmgw.store.leases import ControlPlaneRecord, Fence, LeaseState

log = logging.getLogger(__name__)

LEADING = "leading"
PAUSED = "paused"
STANDBY = "standby"

LAPSE_MARGIN_S = 0.05
"""A standby asks for the lease this long after the one it saw should lapse."""

OUTAGE_ROUND_S = 1.0
"""Seconds between rounds while the store does not answer (a round, if that is shorter)."""


class LeaseBackend(Protocol):
    """What leadership needs of the store (:class:`llmgw.store.leases.Leases`)."""

    async def acquire(self, name: str, ttl_s: float) -> int | None: ...
    async def renew(self, name: str, epoch: int, ttl_s: float) -> bool: ...
    async def release(self, name: str, epoch: int) -> None: ...
    async def current(self) -> LeaseState: ...
    async def announce(self, name: str, agent_address: str, http_address: str) -> None: ...
    async def control_planes(self) -> list[ControlPlaneRecord]: ...


@dataclass(frozen=True)
class Identity:
    """This control plane: its name and where agents and clients reach it."""

    name: str
    agent_address: str
    http_address: str


class Leadership:
    """One control plane's side of the lease."""

    def __init__(
        self,
        leases: LeaseBackend,
        fence: Fence,
        me: Identity,
        *,
        lease_s: float = 10.0,
        on_change: Callable[[str], None] = lambda state: None,
        before_leading: Callable[[], Awaitable[None]] | None = None,
        on_planes: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        store_timeout_s: float = 5.0,
    ) -> None:
        self._leases = leases
        self._fence = fence
        self.me = me
        self.lease_s = lease_s
        self._on_change = on_change
        self._before_leading = before_leading
        self._on_planes = on_planes
        self._prepared = False
        self._clock = clock
        self.state = STANDBY
        self.epoch: int | None = None
        self._deadline = 0.0
        self._store_out = False
        self._store_timeout_s = store_timeout_s
        self._saw_outage = False
        """A standby saw the store out of reach and has not yet seen it answer again."""
        self._quiet_until = float("-inf")
        """A standby leaves the lease alone until then, on the monotonic clock (after an outage)."""
        self._last_round = float("-inf")
        """When the last round ended (store answered or not), on the monotonic clock."""
        self.holder = ""
        """The control plane leading as of the last round ("" when none)."""
        self.control_planes: list[ControlPlaneRecord] = []
        """Every control plane announced, as of the last round (a change counts in :attr:`generation`)."""
        self._lapses_in = 0.0
        self._changed = asyncio.Event()
        self.generation = 0
        """Grows by one at every change of state, of leader or of the control planes there are."""

    @property
    def round_s(self) -> float:
        """Seconds between rounds: renewed three times per lease."""
        return self.lease_s / 3

    def quiet_after_outage_s(self) -> float:
        """How long a standby leaves the lease alone once the store answers again: long enough for a
        leader whose call the outage left hanging to see it time out, wait an outage round and renew."""
        return self._store_timeout_s + OUTAGE_ROUND_S + self.round_s

    def next_round_in(self) -> float:
        """Seconds until the next round: a standby asks again the moment the lease it saw lapses;
        while the store is away, every :data:`OUTAGE_ROUND_S`."""
        if self._store_out:
            return min(self.round_s, OUTAGE_ROUND_S)
        if self.epoch is not None or self._lapses_in <= 0:
            return self.round_s
        return min(self.round_s, self._lapses_in + LAPSE_MARGIN_S)

    @property
    def leading(self) -> bool:
        return self.state == LEADING and self._clock() < self._deadline

    @property
    def serving(self) -> bool:
        """Whether this control plane serves agents and clients itself: leading on a renewal younger
        than the lease, or paused in an outage that a round younger than the lease still saw."""
        if self.state == PAUSED:
            return self._clock() - self._last_round < self.lease_s
        return self.leading

    @property
    def leader(self) -> ControlPlaneRecord | None:
        """Where the leader is reached, as of the last round."""
        return next((p for p in self.control_planes if p.name == self.holder), None)

    async def wait_changed(self, timeout_s: float, seen: int | None = None) -> None:
        """Return when the state or the leader changes, or after ``timeout_s``.

        With ``seen`` (a :attr:`generation` read earlier), return at once if it changed since.
        """
        if seen is not None and seen != self.generation:
            return
        event = self._changed
        await wait_event(event, timeout_s)

    def _set(self, state: str, why: str) -> None:
        if state == self.state:
            return
        log.info("control plane %s: %s -> %s (%s)", self.me.name, self.state, state, why)
        self.state = state
        self._notify()
        self._on_change(state)

    def _notify(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def round(self) -> None:
        """One round: announce, renew or ask, then learn who leads."""
        started = self._clock()
        try:
            await self._leases.announce(self.me.name, self.me.agent_address, self.me.http_address)
            if self.epoch is not None:
                await self._renew(started)
            elif self._saw_outage:
                self._saw_outage = False
                self._quiet_until = started + self.quiet_after_outage_s()
                log.info(
                    "the store is back: leaving the lease alone for %.1f s, so a leader that kept "
                    "leading renews first",
                    self.quiet_after_outage_s(),
                )
            elif started >= self._quiet_until:
                await self._ask(started)
            await self._learn()
            if self._store_out:
                log.info("the store answers again")
            self._store_out = False
        except StoreError as error:
            if not self._store_out:
                log.warning("leadership round failed: %s", error)
            self._store_out = True
            if self.epoch is None and self.holder:  # another led: give it the first renewal
                self._saw_outage = True
            elif self.state == LEADING and self._clock() >= self._deadline:
                self._set(PAUSED, "the store has not answered for a whole lease")
        finally:
            self._last_round = self._clock()

    async def _learn(self) -> None:
        """Read who leads and which control planes there are; tell watchers what changed."""
        lease = await self._leases.current()
        planes = await self._leases.control_planes()
        known = {p.agent_address for p in self.control_planes}
        self.control_planes = planes
        if known and {p.agent_address for p in planes} != known:
            self._notify()  # watchers (the leader's duties) tell the agents
            self._on_planes()
        holder = lease.holder if lease.held else ""
        self._lapses_in = lease.expires_in_s if holder else 0.0
        if holder != self.holder:
            self.holder = holder
            self._notify()

    async def follow(self) -> None:
        """Learn who leads every second, never asking for the lease, until cancelled: a control plane
        stopping runs this once it resigned, so the requests it still holds go to the new leader."""
        while True:
            try:
                await self._learn()
            except StoreError as error:
                log.info("stopping: cannot learn who leads: %s", error)
            await asyncio.sleep(min(self.round_s, OUTAGE_ROUND_S))

    async def _renew(self, started: float) -> None:
        assert self.epoch is not None
        if await self._leases.renew(self.me.name, self.epoch, self.lease_s):
            self._deadline = started + self.lease_s
            await self._lead(f"renewed the lease at epoch {self.epoch}")
        else:
            self.epoch = None
            self._fence.epoch = None
            self._prepared = False
            self._set(STANDBY, "another control plane took the lease")

    async def _ask(self, started: float) -> None:
        epoch = await self._leases.acquire(self.me.name, self.lease_s)
        if epoch is None:
            return
        self.epoch = epoch
        self._fence.epoch = epoch
        self._deadline = started + self.lease_s
        self.holder = self.me.name  # before leading is announced: whoever it wakes sees the new leader
        await self._lead(f"took the lease at epoch {epoch}")

    async def _lead(self, why: str) -> None:
        """Lead, once what the leader keeps in memory (keys, catalog, replicas) has been read;
        if that fails, the next round tries again and the lease is kept meanwhile."""
        if not self._prepared and self._before_leading is not None:
            try:
                await self._before_leading()
            except LlmgwError as error:
                log.warning("holding the lease but not leading yet: %s", error)
                return
        self._prepared = True
        self._set(LEADING, why)

    def expire(self) -> None:
        """Stop leading when the local deadline passed between rounds (checked by :meth:`run`)."""
        if self.state == LEADING and self._clock() >= self._deadline:
            self._set(PAUSED, "the lease was not renewed in time")

    async def run(
        self, me: Identity | None = None, before_leading: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Take part in leadership until cancelled; ``me``: where this process is reached, once it listens;
        ``before_leading``: what fills the leader's memory before it leads (the parts it fills are built
        after this one, so they are handed over when it runs)."""
        if me is not None:
            self.me = me
        if before_leading is not None:
            self._before_leading = before_leading
        while True:
            await self.round()
            await asyncio.sleep(self.next_round_in())
            self.expire()

    async def resign(self) -> None:
        """Give the lease up (a clean stop), so a standby leads without waiting for it to lapse."""
        epoch, self.epoch = self.epoch, None
        self._fence.epoch = None
        self._prepared = False
        self._set(STANDBY, "stopping")
        if epoch is not None:
            try:
                await self._leases.release(self.me.name, epoch)
            except StoreError as error:
                log.warning("could not release the lease: %s", error)
