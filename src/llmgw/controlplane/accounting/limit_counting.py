"""The tokens counted against day and month budgets, written to the store every second or so.

The gateway counts in memory (:class:`~llmgw.gateway.limiting.Limiter`);
:class:`LimitCounts` takes what it counted since the last write
(``feed.limits_unsaved()``) and adds it to the store's counts
(:meth:`~llmgw.store.limits.StoredLimits.add`). A write that fails keeps its
counts for the next one. The leader reads the counts back on leading
(:meth:`load`), so a failover or restart loses at most one interval of
counting (docs/tenancy.md, Limits).

A standby serving ``/v1`` from the leader's state (``controlplane/statesharing/statestream.py``)
writes nothing: it hands what it counted to the leader (``hand_off``), which
adds it (:meth:`LimitCounts.add`) to what it writes. After each write the
leader reads the totals back into its gateway, whose feed streams them to
the standbys: every plane's meters then hold what every plane spent, up to
about two intervals late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmgw.errors import LlmgwError
from llmgw.gateway.feeding import GatewayFeed
from llmgw.store.database import Store

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
"""Seconds between writes of the counts."""


class LimitCounts:
    """Writes the gateway's counts to the store (while leading), and loads them back."""

    def __init__(
        self,
        store: Store,
        feed: GatewayFeed,
        now: Callable[[], float],
        may_write: Callable[[], bool] = lambda: True,
        interval_s: float = INTERVAL_S,
        hand_off: Callable[[dict[str, int]], None] | None = None,
        observe: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        self._store = store
        self._feed = feed
        self._now = now
        self._may_write = may_write
        self._interval_s = interval_s
        self._pending: dict[str, int] = {}
        self._hand_off = hand_off
        self._observe = observe
        """Told what this plane (its workers included) counted at each flush: its use of each subject."""

    def add(self, tokens: dict[str, int]) -> None:
        """Tokens another plane counted: written with the next write."""
        for subject, count in tokens.items():
            self._pending[subject] = self._pending.get(subject, 0) + int(count)

    async def load(self) -> None:
        """The counts of this day and month as the store holds them (plus what waits to be written),
        into the gateway."""
        spent = await self._store.limits.spent(self._now())
        for subject, tokens in self._pending.items():
            day, month = spent.get(subject, (0, 0))
            spent[subject] = (day + tokens, month + tokens)
        self._feed.limits_counted(spent)

    async def flush(self) -> int:
        """Write what was counted since the last write; returns the subjects written."""
        counted = self._feed.limits_unsaved()
        if self._observe is not None and counted:
            self._observe(counted)
        for subject, tokens in counted.items():
            self._pending[subject] = self._pending.get(subject, 0) + tokens
        if not self._pending:
            return 0
        if not self._may_write():
            if self._hand_off is not None:
                pending, self._pending = self._pending, {}
                self._hand_off(pending)
            return 0
        pending, self._pending = self._pending, {}
        try:
            await self._store.limits.add(pending, self._now())
        except LlmgwError:
            for subject, tokens in pending.items():
                self._pending[subject] = self._pending.get(subject, 0) + tokens
            raise
        if self._hand_off is not None:
            await self.load()  # the totals, every plane's share included, to the gateway and its standbys
        return len(pending)

    async def close(self) -> None:
        """The last write, at shutdown (before resigning); a failure is logged, not raised."""
        try:
            await self.flush()
        except LlmgwError as error:
            log.warning("could not write the last limits' counts: %s", error)

    async def run(self) -> None:
        """Write every interval until cancelled; a failed write is logged and retried next time."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.flush()
            except LlmgwError as error:
                log.warning("could not write the limits' counts (kept for the next write): %s", error)
