"""What the reconciler is in the middle of, kept in the store so that a new leader carries it on.

The agents tell a new leader which shards run; they cannot tell it which of
them the last leader was draining. So each drain the reconciler begins is
written to the store (``store.leader_state``) in the pass that began it, and a
control plane about to lead reads them back (:meth:`UnderWay.restore`): a
replica draining stays draining, its requests finishing and no new one
sent to it, and its ``drain_timeout_s`` counts from when the drain began, not
from the failover. A drain ends with its replica's row (the replica stopped).

The same goes for an adapter roll's surge (:mod:`.adapterrolling`), the
replica a roll placed beyond its model's count: written when the pass that
placed it has written it, forgotten when an old replica drained in its place,
and read back by a new leader, which goes on with the same surge (its count
then ends where the roll began, and the roll does not start over).

Times: the reconciler's clock is monotonic and each process has its own, so
the store keeps when a drain began as wall time (the store's clock) and a new
leader turns it back into its own clock's reading.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.store.database import Store
from llmgw.store.leaderstate import DrainRecord


class UnderWay:
    """The drains begun and not yet written; writing them; reading back what the last leader wrote."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self._unsaved: builtins.list[DrainRecord] = []
        """Drains begun since the last write, in order."""
        self._surges: dict[str, str] = {}
        """The surges as last written or read (model -> replica)."""

    def drain_begun(self, replica: ReplicaState) -> None:
        """``replica`` began draining now: written at the next :meth:`save`."""
        since = self._store.now()
        if replica.draining_since is not None:  # began earlier on this clock
            since = self._wall(replica.draining_since)
        self._unsaved.append(DrainRecord(replica.replica_id, since, replica.drain_reason))

    async def save(self, surges: Mapping[str, str]) -> None:
        """Write the drains begun since the last write (in one transaction), and ``surges`` where they
        changed; what a failure left unwritten is written at the next call."""
        drains, self._unsaved = self._unsaved, []
        try:
            await self._store.leader_state.begin_drains(drains)
        except BaseException:
            self._unsaved = drains + self._unsaved
            raise
        if dict(surges) != self._surges:
            await self._store.leader_state.keep_surges(surges)
            self._surges = dict(surges)

    async def restore(self, fleet: Fleet) -> tuple[builtins.list[ReplicaState], dict[str, str]]:
        """Mark draining each replica of ``fleet`` the store says drains (since when it began there);
        those replicas, and each model's roll surge (of those ``fleet`` tracks). A drain this process
        began and the store lacks is written at the next save."""
        drains = await self._store.leader_state.drains()
        self._surges = await self._store.leader_state.surges()
        draining = []
        for drain in drains:
            replica = fleet.replicas.get(drain.replica_id)
            if replica is None:
                continue
            if replica.draining_since is None:
                replica.draining_since = self._monotonic(drain)
                replica.drain_reason = drain.reason
            draining.append(replica)
        recorded = {drain.replica_id for drain in drains} | {drain.replica_id for drain in self._unsaved}
        for replica in fleet.replicas.values():  # begun while this process led before, never written
            if replica.draining_since is not None and replica.replica_id not in recorded:
                self.drain_begun(replica)
                draining.append(replica)
        return draining, {model: r for model, r in self._surges.items() if r in fleet.replicas}

    def _monotonic(self, drain: DrainRecord) -> float:
        """When ``drain`` began, on the reconciler's clock (never later than now)."""
        return self._clock() - max(0.0, (self._store.now() - drain.since).total_seconds())

    def _wall(self, monotonic: float) -> datetime:
        return self._store.now() - timedelta(seconds=max(0.0, self._clock() - monotonic))
