"""Reading every ready replica's load from its engine's metrics (C6.2).

Each ``interval_s`` the reader fetches the metrics of every replica in the
router's table, by the names of the engine that serves it (vLLM, SGLang,
TensorRT-LLM, llama.cpp: see ``llmgw.engines``), and hands the table the
requests the engine reports running and waiting. A replica whose metrics
cannot be read — unreachable, an error status, text without its engine's
gauges, ``+Inf`` or NaN gauges, bytes that are not text, anything — is marked
unreadable with the reason and routed around until a later read succeeds: the
router never routes to a replica blind, and one replica's failure never stops
the reader (which runs under the process supervisor, restarted if it fails).
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


@dataclass(frozen=True)
class LoadSettings:
    interval_s: float = 1.0
    """Seconds between two reads of every replica's metrics."""
    timeout_s: float = 2.0
    """A read that takes longer counts as failed."""


@dataclass
class LoadReading:
    """The last read of one replica."""

    load: EngineLoad | None = None
    """None until a read succeeds, and after one fails."""
    error: str = ""
    """Why the last read failed (empty after a success)."""
    failures: int = field(default=0)
    """Reads failed in a row."""


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

    async def read_once(self) -> None:
        """Read every ready replica once, all at the same time."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        endpoints = self.table.endpoints()
        for gone in set(self.readings) - {e.replica_id for e in endpoints}:
            del self.readings[gone]
        await asyncio.gather(*(self._read(endpoint) for endpoint in endpoints))

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
            self.table.set_engine_load(endpoint.replica_id, None)
            return
        if reading.failures:
            log.info("replica %s: load readable again; routed to", endpoint.replica_id)
        reading.load, reading.error, reading.failures = load, "", 0
        self.table.set_engine_load(endpoint.replica_id, load.running + load.waiting)

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
