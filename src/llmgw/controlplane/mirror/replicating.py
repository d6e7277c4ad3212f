"""Mirror replicating: each control plane pulls the blobs it lacks from its peers, and imports wait
for their copies.

Every control plane keeps the mirror's files on its own disk; the store says
which plane holds which blob (``blob_copies``). :class:`MirrorReplicator`
runs on every plane, leading or not, as the supervised ``mirror-replicator``
component. Every ``mirror.interval_s`` it compares the blobs the store lists
with the files here:

- a file here that the store does not credit to this plane is recorded (an
  import made before copies were recorded, or a record lost);
- a copy credited to this plane whose file is gone is forgotten;
- a copy credited to this plane of a blob the store no longer lists (a
  client's file deleted or expired: ``store/files.py``) is removed here and
  forgotten: copies are read before the blobs, and every import records
  its blob before its copy, so a blob just imported is never taken for one;
- a blob missing here is pulled from a live peer holding it, the leader
  first, over the agent port with this plane's certificate (a node's
  certificate cannot pull arbitrary blobs: ``controlplane/wiring.py``),
  checked against its sha256 and resumed where an earlier pull stopped;
  ``mirror.concurrency`` blobs at once, progress logged each quarter.

An import calls :meth:`MirrorReplicator.acknowledge`: it records this plane's
copy, then waits (up to ``mirror.ack_wait_s``) until the blob is on the
copies wanted (``mirror.copies``; every plane, at most 2, by default) or no
live peer is still to pull it, and answers how many copies there are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from llmgw.controlplane.config import MirrorSettings
from llmgw.controlplane.lifecycle.leadership import Identity
from llmgw.errors import LlmgwError, StoreError
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.copies import (
    Acknowledgement,
    Holder,
    PeerFetch,
    acknowledgement,
    pull,
    pull_order,
    wanted_copies,
)
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.blobcopies import BlobCopy
from llmgw.store.blobs import BlobRecord
from llmgw.store.database import Store
from llmgw.store.leases import ControlPlaneRecord

log = logging.getLogger(__name__)

QUARTER = 4
"""A pull's progress is logged this many times over its length."""


class Planes(Protocol):
    """The control planes as leadership last saw them
    (:class:`~llmgw.controlplane.lifecycle.leadership.Leadership`)."""

    me: Identity
    holder: str
    control_planes: list[ControlPlaneRecord]


class MirrorReplicator:
    """Keeps this plane's mirror holding every blob the store lists, pulling from peers."""

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        planes: Planes,
        fetch: PeerFetch,
        settings: MirrorSettings,
        *,
        live_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._blobs = blobs
        self._planes = planes
        self._fetch = fetch
        self._settings = settings
        self._live_s = live_s
        """A plane announced within this many seconds is live (may be pulled from, may pull)."""
        self._clock = clock
        self._pulling: set[str] = set()
        self._failed: dict[str, str] = {}
        self._announced: frozenset[str] = frozenset()
        """The blobs the last "pulling" line named (said again only when they change)."""
        """The last reason each blob could not be pulled (logged once until it changes)."""

    def live_peers(self) -> list[str]:
        """The other planes announced lately, as of leadership's last round."""
        me = self._planes.me.name
        return [p.name for p in self._planes.control_planes if p.name != me and p.seen_ago_s <= self._live_s]

    def wanted(self) -> int:
        return wanted_copies(self._settings.copies, max(1, len(self._planes.control_planes)))

    async def run(self) -> None:
        """Look for blobs to record or pull every ``mirror.interval_s``, until cancelled."""
        while True:
            try:
                await self.sync()
            except StoreError as error:
                log.warning("mirror replication skipped a pass: %s", error)
            await self._clock.sleep(self._settings.interval_s)

    async def sync(self) -> int:
        """One pass: record this plane's copies, forget lost ones, pull what is missing; blobs pulled."""
        me = self._planes.me
        if not me.agent_address:
            return 0  # not listening yet: peers could not be told where this copy is
        copies = await self._store.blob_copies.all()  # first: see the module's docstring
        records = await self._store.blobs.list()
        await self._remove_released(copies, {record.sha256 for record in records})
        lacking: list[tuple[BlobRecord, list[BlobCopy]]] = []
        for record in records:
            holders = copies.get(record.sha256, [])
            mine = next((c for c in holders if c.plane == me.name), None)
            here = await asyncio.to_thread(self._blobs.has, record.sha256)
            if here and (mine is None or mine.address != me.agent_address):
                await self._store.blob_copies.record(record.sha256, me.name, me.agent_address)
            elif not here and mine is not None:
                log.warning(
                    "blob %s… is credited to %s but its file is gone: pulling it again",
                    record.sha256[:12],
                    me.name,
                )
                await self._store.blob_copies.forget(record.sha256, me.name)
            if not here:
                lacking.append((record, [c for c in holders if c.plane != me.name]))
        return await self._pull_all(lacking)

    async def _remove_released(self, copies: dict[str, list[BlobCopy]], listed: set[str]) -> None:
        me = self._planes.me.name
        for sha256, holders in copies.items():
            if sha256 in listed or not any(c.plane == me for c in holders):
                continue
            removed = await asyncio.to_thread(self._blobs.remove, sha256)
            await self._store.blob_copies.forget(sha256, me)
            if removed:
                log.info("removed blob %s…: the store no longer lists it", sha256[:12])

    async def _pull_all(self, lacking: Sequence[tuple[BlobRecord, list[BlobCopy]]]) -> int:
        live = {self._planes.me.name, *self.live_peers()}
        todo = [
            (record, places)
            for record, holders in lacking
            if record.sha256 not in self._pulling
            and (
                places := pull_order([Holder(c.plane, c.address) for c in holders], self._planes.holder, live)
            )
        ]
        if not todo:
            return 0
        if (wanted := frozenset(record.sha256 for record, _ in todo)) != self._announced:
            self._announced = wanted
            log.info(
                "pulling %d blobs (%d bytes) from peers, %d at a time",
                len(todo),
                sum(record.size for record, _ in todo),
                self._settings.concurrency,
            )
        room = asyncio.Semaphore(self._settings.concurrency)
        pulled: list[bool] = []

        async def one(record: BlobRecord, places: list[str]) -> None:
            async with room:
                pulled.append(await self._pull_one(record, places))

        async with asyncio.TaskGroup() as tasks:
            for record, places in todo:
                tasks.create_task(one(record, places))
        return sum(pulled)

    async def _pull_one(self, record: BlobRecord, places: list[str]) -> bool:
        sha = record.sha256
        self._pulling.add(sha)
        started = time.monotonic()
        logged = [0]

        def progress(done: int, total: int) -> None:
            quarter = done * QUARTER // max(total, 1)
            if quarter > logged[0] and done < total:
                logged[0] = quarter
                log.info("pulling blob %s… (%s): %d of %d bytes", sha[:12], record.filename, done, total)

        try:
            source = await pull(self._blobs, sha, record.size, places, self._fetch, progress)
            await self._store.blob_copies.record(sha, self._planes.me.name, self._planes.me.agent_address)
        except LlmgwError as error:
            said = str(error)
            if self._failed.get(sha) != said:  # once per reason, not at every pass
                log.warning("could not pull blob %s… (%s) yet: %s", sha[:12], record.filename, said)
            self._failed[sha] = said
            return False
        finally:
            self._pulling.discard(sha)
        self._failed.pop(sha, None)
        log.info(
            "pulled blob %s… (%s, %d bytes) from %s in %.1f s",
            sha[:12],
            record.filename,
            record.size,
            source,
            time.monotonic() - started,
        )
        return True

    async def pull_now(self, sha256: str) -> bool:
        """Pull one blob the store lists from a live peer now, not at the next pass (a client reads
        a file this plane lacks yet); whether this plane holds it after."""
        if await asyncio.to_thread(self._blobs.has, sha256):
            return True
        record = next((r for r in await self._store.blobs.list() if r.sha256 == sha256), None)
        if record is None:
            return False
        holders = [c for c in await self._store.blob_copies.of(sha256) if c.plane != self._planes.me.name]
        live = {self._planes.me.name, *self.live_peers()}
        places = pull_order([Holder(c.plane, c.address) for c in holders], self._planes.holder, live)
        if not places or sha256 in self._pulling:
            return False
        return await self._pull_one(record, places)

    async def acknowledge(self, sha256: str) -> Acknowledgement:
        """Record this plane's copy of a blob just imported, then wait for the copies wanted (or for
        no live peer still to pull it, or ``mirror.ack_wait_s``) and say how many there are."""
        me = self._planes.me
        await self._store.blob_copies.record(sha256, me.name, me.agent_address)
        wanted = self.wanted()
        deadline = self._clock.monotonic() + self._settings.ack_wait_s
        while True:
            held = [c.plane for c in await self._store.blob_copies.of(sha256)]
            pending = [p for p in self.live_peers() if p not in held]
            if len(held) >= wanted or not pending or self._clock.monotonic() >= deadline:
                return acknowledgement(held, wanted, pending)
            await self._clock.sleep(self._settings.interval_s)
