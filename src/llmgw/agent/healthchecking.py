"""Health-checking engines: until one first answers (its start-up), then while it serves (liveness).

An engine has ``shards.health_timeout_s`` to answer its health check for the
first time (loading a model can take long). Once it has, it must keep
answering: one that goes ``shards.liveness_s`` without an answer is taken for
frozen, and its shard's supervisor kills it. A check still pending when the
time is up counts as unanswered, since a stopped process (SIGSTOP) accepts
connections but never answers them. Every wait is on the supervisor's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from llmgw.agent.config import ShardSettings
from llmgw.agent.launching import EngineProcess, cancelled, done_within
from llmgw.engines import engine as engines
from llmgw.runtime.clock import Clock

HEALTH_POLL_S = 0.25
"""Seconds between health checks while an engine starts."""
LIVENESS_POLL_S = 1.0
"""Most seconds between a ready engine's health checks (a third of the liveness when that is shorter)."""


class HealthChecks:
    """Asks a node's engines whether they answer, over one HTTP session."""

    def __init__(self, settings: ShardSettings, clock: Clock, host: str = "127.0.0.1") -> None:
        self._settings = settings
        self._clock = clock
        self._host = host
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._http

    async def first_answer(
        self,
        engine: engines.Engine,
        process: EngineProcess,
        port: int,
        api_key: str,
        stopping: Callable[[], bool],
    ) -> bool:
        """True once the engine answers; False when its process ends, it is stopping, or the
        start-up time (``health_timeout_s``) passes first."""
        base = f"http://{self._host}:{port}"
        deadline = self._clock.monotonic() + self._settings.health_timeout_s
        ended = asyncio.ensure_future(process.wait())
        try:
            while not ended.done() and not stopping() and self._clock.monotonic() < deadline:
                if await engines.health(engine, self._session(), base, api_key):
                    return True
                await done_within(ended, HEALTH_POLL_S, self._clock)
            return False
        finally:
            await cancelled(ended)

    async def stays_live(
        self,
        engine: engines.Engine,
        process: EngineProcess,
        port: int,
        api_key: str,
        stopping: Callable[[], bool],
    ) -> bool:
        """Check a ready engine until its process ends or it is stopping (True), or until it has
        gone ``liveness_s`` without answering (False). A liveness of 0 checks nothing (True at once)."""
        liveness = self._settings.liveness_s
        if liveness <= 0:
            return True
        base = f"http://{self._host}:{port}"
        poll = min(LIVENESS_POLL_S, liveness / 3)
        answered = self._clock.monotonic()
        ended = asyncio.ensure_future(process.wait())
        try:
            while not ended.done() and not stopping():
                left = answered + liveness - self._clock.monotonic()
                if left <= 0:
                    return False
                check = asyncio.ensure_future(
                    engines.health(engine, self._session(), base, api_key, timeout=left)
                )
                try:
                    if await done_within(check, left, self._clock) and check.result():
                        answered = self._clock.monotonic()
                finally:
                    await cancelled(check)
                if self._clock.monotonic() - answered >= liveness:
                    return False
                await done_within(ended, poll, self._clock)
            return True
        finally:
            await cancelled(ended)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
