"""The leader divides every rate and concurrency limit between the control planes serving /v1.

The planes serving /v1 are the leader and the standbys following its gateway
state stream (``controlplane/statesharing/statestream.py`` tells :meth:`LimitSharing.joined`
and :meth:`LimitSharing.left`). Their recent use of each limited subject is
the tokens each counted (``controlplane/accounting/limit_counting.py``: the leader's own
every second, with its workers'; each standby's with the counts it hands
over), decayed by :data:`DECAY` each :data:`INTERVAL_S`. The leader divides
(:func:`~llmgw.core.limitshares.divide`) at once when a plane comes or goes
and every interval after, and tells its feed when the division moved
(:meth:`~llmgw.gateway.feeding.GatewayFeed.limits_shared`): its own gateway
takes its share, and the state stream and the local channel carry the
division to every standby and gateway worker, each taking its own.

A standby that loses the stream keeps the shares it had (the cluster then
admits less than the limit, not more, until a leader divides again); a new
leader starts alone (its share whole) and divides again as the standbys
follow it, so during a failover's seconds the cluster may admit up to the
limit plus the old shares of the planes not yet following.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from llmgw.core.limits import is_cost_subject
from llmgw.core.limitshares import PlaneShares, divide
from llmgw.gateway.feeding import GatewayFeed

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
"""How often the leader divides again by use."""
DECAY = 0.7
"""What is left of a plane's counted use after each interval (about three intervals' memory)."""
FORGET = 0.01
"""Use below this is forgotten (the subject is split evenly again)."""


class LimitSharing:
    """The leader's division of the limits between the planes that serve /v1."""

    def __init__(
        self,
        me: str,
        feed: GatewayFeed,
        leading: Callable[[], bool],
        interval_s: float = INTERVAL_S,
    ) -> None:
        self._me = me
        self._feed = feed
        self._leading = leading
        self._interval_s = interval_s
        self._followers: dict[str, int] = {}
        """Standbys following the state stream (a count: a plane may reconnect before its old stream ends)."""
        self._use: dict[str, dict[str, float]] = {}
        self._sent: PlaneShares | None = None

    @property
    def planes(self) -> tuple[str, ...]:
        return tuple(sorted({self._me, *self._followers}))

    def joined(self, plane: str) -> None:
        """A standby follows the state stream: divided again before its full copy is taken."""
        self._followers[plane] = self._followers.get(plane, 0) + 1
        self.divide()

    def left(self, plane: str) -> None:
        """A standby's stream ended: its shares go to the others."""
        count = self._followers.get(plane, 0) - 1
        if count > 0:
            self._followers[plane] = count
        else:
            self._followers.pop(plane, None)
            self._use.pop(plane, None)
        self.divide()

    def used(self, plane: str, tokens: Mapping[str, int]) -> None:
        """Tokens ``plane`` counted per subject since its last report (its workers' included)."""
        if not plane:
            return  # a standby of an older release names no plane: its use is not weighed
        by = self._use.setdefault(plane, {})
        for subject, count in tokens.items():
            if count > 0 and not is_cost_subject(subject):  # money is not divided: a budget's count
                by[subject] = by.get(subject, 0.0) + count

    def divide(self) -> PlaneShares | None:
        """Divide again (while leading); the feed is told when a share moved or the planes changed."""
        if not self._leading():
            self._sent = None  # the next time this plane leads it divides afresh
            return None
        shares = divide(self.planes, self._use)
        if self._sent is None or not shares.close_to(self._sent):
            if self._sent is None or shares.planes != self._sent.planes:
                log.info("limits divided between the planes serving /v1: %s", ", ".join(shares.planes))
            self._feed.limits_shared(shares)
            self._sent = shares
        return self._sent

    def tick(self) -> None:
        """One interval passed: older use weighs less, and the division follows."""
        for plane in list(self._use):
            by = self._use[plane]
            for subject in list(by):
                by[subject] *= DECAY
                if by[subject] < FORGET:
                    del by[subject]
            if not by:
                del self._use[plane]
        self.divide()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self.tick()
