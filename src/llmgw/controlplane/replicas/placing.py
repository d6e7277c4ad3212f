"""Placing new replicas: where each goes, and a pass's placements written together.

A pass looks first at its index of free cards (:class:`~llmgw.core.freecards.FreeCards`, built at its
first placement and kept up to date by its own placements: a pass that places a thousand replicas looks
at the best node first, not at every one), and weighs every node only when that does not settle it
(:meth:`Placer.decide`, also what ``/api/plan`` shows). A replica that fits nowhere drains the
lower-priority replicas whose going makes room, if any would (:mod:`llmgw.core.eviction`).

A pass places at most :data:`PLACEMENTS_PER_PASS` replicas (:attr:`Placer.more` then says so, and the
reconciler passes again at once): a fresh catalog of a thousand replicas is placed over a few passes of
tens of milliseconds, the event loop serving agents and clients between them, rather than in one pass
that holds it for a tenth of a second or more.

The replicas a pass places are tracked in the fleet at once (the rest of the pass counts them), written
to the store together in one transaction at the pass's end, and only then are their nodes told to start
them (:meth:`Placer.flush`): a node never runs a replica a new leader would not find in the store.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.replicas import multinode
from llmgw.controlplane.replicas.reconciletracing import PassTrace
from llmgw.controlplane.replicas.shardspecs import replica_key
from llmgw.core.catalog import ModelDefinition
from llmgw.core.environments import environment_of
from llmgw.core.eviction import plan_eviction
from llmgw.core.freecards import FreeCards
from llmgw.core.placement import Ask, Decision, Placed, place_profiles
from llmgw.core.trainingplacement import TrainingHold, withheld
from llmgw.store.database import Store
from llmgw.store.replicas import ReplicaRecord

log = logging.getLogger(__name__)

PLACEMENTS_PER_PASS = 64
"""The replicas one pass places at most; the next pass, run at once, places the rest."""

Start = Callable[[ReplicaState, ModelDefinition, tuple[int, ...]], Awaitable[None]]
"""Tell a replica's node to start it (the reconciler's ``_start``)."""


@dataclass(frozen=True, slots=True)
class _Pending:
    """A shard placed this pass, not yet in the store nor asked of its node."""

    record: ReplicaRecord
    replica: ReplicaState
    model: ModelDefinition


class Placer:
    """Where new replicas go, why a model cannot be placed, and the pass's placements until written."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        definitions: Callable[[], Mapping[str, ModelDefinition]],
        training_holds: Callable[[], Sequence[TrainingHold]],
        drain: Callable[[ReplicaState, str], None],
        per_pass: int = PLACEMENTS_PER_PASS,
    ) -> None:
        self._fleet = fleet
        self._per_pass = per_pass
        self._placed_now = 0
        self.more = False
        """The last pass stopped placing at :data:`PLACEMENTS_PER_PASS` with more to place."""
        self._definitions = definitions
        """The catalog as last read: the priorities eviction compares."""
        self._training_holds = training_holds
        self._drain = drain
        self.unplaced: dict[str, str] = {}
        """Models that could not be placed, with every node's reason."""
        self.evictions: dict[str, str] = {}
        """Each model's last eviction decision, in words (the log says it too)."""
        self._free: FreeCards | None = None
        self._pending: list[_Pending] = []

    def set_unplaced(self, model: str, reasons: str) -> None:
        """Record why ``model`` cannot be placed (empty: it can); a new verdict changes its view."""
        if self.unplaced.get(model, "") == reasons:
            return
        if reasons:
            self.unplaced[model] = reasons
        else:
            del self.unplaced[model]
        self._fleet.changes.changed("models")

    def begin_pass(self) -> None:
        """A pass begins: it may place :data:`PLACEMENTS_PER_PASS` replicas."""
        self._placed_now = 0
        self.more = False
        self.forget_index()

    def spent(self) -> bool:
        """Whether this pass placed as many replicas as it may (:attr:`more` is then set)."""
        if self._placed_now >= self._per_pass:
            self.more = True
        return self.more

    def forget_index(self) -> None:
        """A replica went: the index of free cards is built again at the next placement."""
        self._free = None

    def place(self, model: ModelDefinition, placed: list[ReplicaRecord], trace: PassTrace) -> bool:
        """Place one more replica of ``model`` (tracked now, written and started by :meth:`flush`);
        False, with its reasons in :attr:`unplaced`, when no node can take it, and False (with
        :attr:`more` set) when the pass placed as many as it may."""
        if self.spent():
            return False
        decision = self._from_index(model, placed) or self.decide(model, placed)
        if not decision.placed:
            decision = self._evict(model, decision, placed)
            reasons = (
                "; ".join(f"{node}: {why}" for node, why in decision.refusals.items())
                or "no node is connected"
            )
            if decision.evict or decision.waiting_for:
                reasons += f"; {self.evictions[model.name]}"
            if self.unplaced.get(model.name) != reasons:  # a trace, like the log, when the reasons change
                log.warning("cannot place a replica of %s: %s", model.name, reasons)
                trace.placed(model.name, decision)
            self.set_unplaced(model.name, reasons)
            return False
        self.set_unplaced(model.name, "")
        self.evictions.pop(model.name, None)
        trace.placed(model.name, decision)
        self._placed_now += 1
        profile = model.profiles[decision.profile]
        replica_id, api_key = f"{_slug(model.name)}-{secrets.token_hex(3)}", replica_key()
        where = [(decision.node_id, decision.devices), *((s.node_id, s.devices) for s in decision.more)]
        for rank, (node_id, devices) in enumerate(where):  # a multi-node replica: one shard a node
            record = ReplicaRecord(
                id=multinode.shard_id(replica_id, rank),
                model=model.name,
                node_id=node_id,
                api_key=api_key,
                devices=list(devices),
                memory_mb=model.memory_needed_mb(profile) // len(where),
                profile=decision.profile,
            )
            placed.append(record)
            if self._free is not None:
                self._free.add(self.held(record))
            replica = ReplicaState(
                replica_id=record.id,
                model=model.name,
                node_id=node_id,
                api_key=api_key,
                capacity=profile.parallel,
                engine=profile.engine,
                profile=decision.profile,
                nodes=len(where),
                rank=rank,
            )
            self._fleet.track(replica)
            self._pending.append(_Pending(record, replica, model))
        on = f" with profile {decision.profile + 1}" if len(model.profiles) > 1 else ""
        nodes = ", ".join(node_id for node_id, _ in where)
        log.info("placed replica %s of %s on %s%s", replica_id, model.name, nodes, on)
        return True

    async def flush(self, store: Store, start: Start) -> None:
        """Write the pass's placements in one transaction, then tell each node to start its shards.

        A placement whose replica the pass has since forgotten, or whose model left the catalog, is
        dropped; when the write fails, the pass's placements are forgotten (the next pass places again).
        """
        pending, self._pending = self._pending, []
        pending = [p for p in pending if self._fleet.replicas.get(p.record.id) is p.replica]
        try:
            stored = {record.id for record in await store.replicas.add_all([p.record for p in pending])}
        except BaseException:
            self._forget(pending)
            raise
        self._forget([p for p in pending if p.record.id not in stored])
        for shard in pending:
            if shard.record.id in stored:
                await start(shard.replica, shard.model, tuple(shard.record.devices))

    def abandon(self) -> None:
        """The pass ended before :meth:`flush`: forget its placements, never written nor started."""
        pending, self._pending = self._pending, []
        self._forget(pending)

    def _forget(self, pending: list[_Pending]) -> None:
        for shard in pending:
            if self._fleet.replicas.get(shard.record.id) is shard.replica:
                self._fleet.forget(shard.record.id)
        self._free = None

    def _from_index(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> Decision | None:
        """Where the index of free cards puts one more replica of ``model`` (its first profile, on a node
        without one); None when it cannot tell, and every node is weighed (:meth:`decide`)."""
        if self._free is None:
            nodes = withheld([n.inventory for n in self._fleet.nodes.values()], self._training_holds())
            self._free = FreeCards(nodes, [self.held(r) for r in placed])
        profile = model.profiles[0]
        found = self._free.best(
            model.name, model.memory_needed_mb(profile), profile.spread, gpu_class=profile.gpu_class
        )
        if found is not None and found.node_id not in self._fleet.nodes:  # it left during the pass
            self._free.node_left(found.node_id)
            return None
        return found

    def _evict(self, model: ModelDefinition, unplaced: Decision, placed: list[ReplicaRecord]) -> Decision:
        """Drain the lower-priority replicas whose going makes room for ``model``, if any would."""
        decision = self.decide(model, placed, unplaced=unplaced)
        if decision.evict:
            for replica_id in decision.evict:
                victim = self._fleet.replicas.get(replica_id)
                if victim is not None:
                    self._drain(victim, f"evicted for {model.name} (priority {model.priority})")
            verdict = f"evicting {', '.join(decision.evict)} on {decision.evict_node}"
        elif decision.waiting_for:
            verdict = f"waiting for {', '.join(decision.waiting_for)} to drain on {decision.evict_node}"
        else:
            self.evictions.pop(model.name, None)
            return decision
        if self.evictions.get(model.name) != verdict:
            kept = "; ".join(f"{r} kept: {why}" for r, why in sorted(decision.kept.items()))
            log.warning(
                "%s cannot be placed as things are: %s%s", model.name, verdict, f" ({kept})" * bool(kept)
            )
        self.evictions[model.name] = verdict
        return decision

    def decide(
        self, model: ModelDefinition, placed: list[ReplicaRecord], *, unplaced: Decision | None = None
    ) -> Decision:
        """Where one more replica of ``model`` would go now, among the connected nodes, with every
        other node's reason (what ``/api/plan`` shows, and what a pass acts on). With ``unplaced``
        (the answer that found no room), which lower-priority replicas would have to go."""
        nodes = withheld([n.inventory for n in self._fleet.nodes.values()], self._training_holds())
        asks = [Ask(model.memory_needed_mb(p), p.spread, p.gpu_class) for p in model.profiles]
        held = [self.held(r) for r in placed]
        if unplaced is None:
            return place_profiles(model.name, asks, nodes, held)
        return plan_eviction(
            model.name, model.priority, asks, nodes, held, unplaced, environment=environment_of(model)
        )

    def held(self, record: ReplicaRecord) -> Placed:
        """``record`` as placement sees it: where it is, what it holds, and what evicting it would take."""
        replica = self._fleet.replicas.get(record.id)
        definition = self._definitions().get(record.model)
        return Placed(
            record.model,
            record.node_id,
            record.memory_mb,
            tuple(record.devices),
            replica_id=record.id,
            priority=definition.priority if definition else 0,
            environment=environment_of(definition) if definition else "",
            draining=replica is not None and replica.draining_since is not None,
        )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:40] or "model"
