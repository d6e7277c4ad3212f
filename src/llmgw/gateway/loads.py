"""Reading every ready replica's load from its engine's metrics (C6.2).

Each ``interval_s`` the reader fetches the metrics of every replica in the
router's table, by the names of the engine that serves it (vLLM, SGLang,
TensorRT-LLM, llama.cpp: see ``llmgw.engines``), and hands the table the
requests the engine reports running and waiting (none, where it publishes no
queue gauges: the table then counts only this router's own requests in flight
on it). A replica whose metrics
cannot be read — unreachable, an error status, text without its engine's
gauges, ``+Inf`` or NaN gauges, bytes that are not text, anything — is marked
unreadable with the reason and routed around until a later read succeeds: the
router never routes to a replica blind, and one replica's failure never stops
the reader (which runs under the process supervisor, restarted if it fails).

At most ``concurrency`` reads run at once, and a replica whose reads keep
failing is read again after 1, 2, 4, then at most ``unreadable_every``
intervals: a new leader with a thousand replicas, many not serving yet, does
not spend its CPU on a thousand failing connections a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import aiohttp

from llmgw.engines.engine import EngineLoad, read_load
from llmgw.engines.registry import engine_named
from llmgw.errors import LlmgwError
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

FRESH_READ_MAX = 4
"""Most replicas of a model :meth:`LoadReader.read_now` reads at once."""


@dataclass(frozen=True)
class LoadSettings:
    interval_s: float = 1.0
    """Seconds between two reads of every replica's metrics."""
    timeout_s: float = 2.0
    """A read that takes longer counts as failed."""
    concurrency: int = 32
    """Reads running at once, at most."""
    unreadable_every: int = 8
    """The most intervals between two reads of a replica whose reads keep failing."""


@dataclass
class LoadReading:
    """The last read of one replica."""

    load: EngineLoad | None = None
    """None until a read succeeds, and after one fails."""
    error: str = ""
    """Why the last read failed (empty after a success)."""
    failures: int = field(default=0)
    """Reads failed in a row."""
    next_round: int = 0
    """The round (:meth:`LoadReader.read_once`) it is read again in, after failures."""


class LoadReader:
    """Reads engines' metrics into a :class:`ReplicaTable`."""

    def __init__(
        self, table: ReplicaTable, settings: LoadSettings | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.table = table
        self.settings = settings or LoadSettings()
        self._clock = clock
        self.readings: dict[str, LoadReading] = {}
        self._session: aiohttp.ClientSession | None = None
        self._round = 0
        self._running = 0
        self.most_at_once = 0
        """The most reads that ran at the same time, for the tests."""

    async def read_once(self) -> None:
        """Read every ready replica that is due, ``concurrency`` at a time."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._round += 1
        endpoints = [e for e in self.table.endpoints() if e.provider is None]  # a provider has no engine
        for gone in set(self.readings) - {e.replica_id for e in endpoints}:
            del self.readings[gone]
        due = [
            e
            for e in endpoints
            if self.readings.setdefault(e.replica_id, LoadReading()).next_round <= self._round
        ]
        limit = asyncio.Semaphore(max(1, self.settings.concurrency))
        await asyncio.gather(*(self._read_within(limit, endpoint) for endpoint in due))

    async def _read_within(self, limit: asyncio.Semaphore, endpoint: ReplicaEndpoint) -> None:
        async with limit:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
            try:
                await self._read(endpoint)
            finally:
                self._running -= 1

    async def _read(self, endpoint: ReplicaEndpoint) -> None:
        assert self._session is not None
        reading = self.readings.setdefault(endpoint.replica_id, LoadReading())
        try:
            engine = engine_named(endpoint.engine)
            load = await read_load(
                engine, self._session, endpoint.base_url, endpoint.api_key, timeout=self.settings.timeout_s
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # whatever one replica answers, the others are still read
            why = str(error) or type(error).__name__
            if not isinstance(error, LlmgwError):
                why = f"its metrics cannot be parsed ({type(error).__name__}: {error})"
            if reading.failures == 0:
                log.warning("replica %s: routed around, load unreadable: %s", endpoint.replica_id, why)
            reading.load, reading.error, reading.failures = None, why, reading.failures + 1
            wait = min(2 ** (reading.failures - 1), max(1, self.settings.unreadable_every))
            reading.next_round = self._round + wait
            self.table.set_engine_load(endpoint.replica_id, None)
            return
        if reading.failures:
            log.info("replica %s: load readable again; routed to", endpoint.replica_id)
        reading.load, reading.error, reading.failures, reading.next_round = load, "", 0, 0
        # No queue gauges (TensorRT-LLM before its first iteration statistics): running and waiting
        # read 0, so the table counts this router's own requests in flight, and the replica is routed to.
        self.table.set_engine_load(endpoint.replica_id, load.running + load.waiting)

    async def read_now(self, model: str, most: int = FRESH_READ_MAX) -> bool:
        """Read the load of ``model``'s ready replicas now, not at the next interval (a batch about to
        send a request: ``controlplane/serving/batching.py``); False, reading nothing, when it has
        none or more than ``most`` (their reads would cost more than the interval's staleness)."""
        endpoints = self.table.ready(model)
        if not endpoints or len(endpoints) > most:
            return False
        if self._session is None:
            self._session = aiohttp.ClientSession()
        await asyncio.gather(*(self._read(endpoint) for endpoint in endpoints))
        return True

    async def run(self) -> None:
        """Read every ``interval_s`` until cancelled."""
        try:
            while True:
                started = self._clock.monotonic()
                await self.read_once()
                elapsed = self._clock.monotonic() - started
                await self._clock.sleep(max(0.0, self.settings.interval_s - elapsed))
        finally:
            await self.close()

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None
