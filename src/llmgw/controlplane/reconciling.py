"""The reconciler: make the replicas running match what the catalog asks for.

Each pass reads the catalog and the replicas placed (desired state, in the
store) and the fleet (observed state, in memory), then decides each model's
count between ``replicas.min`` and ``max`` from the load the gateway sees
(:mod:`llmgw.core.scaling`), places new replicas (the model's profiles tried in
order; a replica that fits nowhere evicts lower-priority replicas,
:mod:`llmgw.core.eviction`), starts the ones their node is not running,
restarts failed ones with backoff, drains the ones no longer wanted and stops
idle on-demand models. A replica drains before it stops: the gateway sends it
no new request at once, and its node is told to stop it once the requests on
it have finished or ``replicas.drain_timeout_s`` has passed. A replica
whose node has been away past the fleet's grace is placed again on another
node (a new replica, with its own key) and the old one forgotten; the node,
should it come back, is told to stop the stray engine.

With tracing on, a pass that does something is a trace and each replica's
start a span until it serves (:mod:`llmgw.controlplane.reconciletracing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Sequence

from llmgw.controlplane import adapterrolling, multinode
from llmgw.controlplane.demand import ModelDemand
from llmgw.controlplane.fleet import Fleet, ReplicaState, shard_blobs
from llmgw.controlplane.reconciletracing import NO_PASS, PassTrace, ReplicaStarts
from llmgw.controlplane.shardspecs import profile_of, replica_key, shard_spec
from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.core.environments import entry_name, environment_of, expand_environments, is_entry
from llmgw.core.eviction import plan_eviction
from llmgw.core.freecards import FreeCards
from llmgw.core.placement import Ask, Decision, Placed, place_profiles
from llmgw.core.scaling import ModelLoad, ScalingHistory, ScalingPolicy, decide_scale
from llmgw.core.settingtypes import SERVING_STOPPED
from llmgw.core.shards import ReplicaPhase, StopShard
from llmgw.core.trainingplacement import TrainingHold, withheld
from llmgw.errors import ChannelClosed, LlmgwError, NotFound
from llmgw.observability.tracing import TRACING_OFF, Tracing
from llmgw.store.database import Store
from llmgw.store.replicas import ReplicaRecord

log = logging.getLogger(__name__)

"""The setting ``llmgw stop`` sets and ``llmgw start`` clears."""


class Reconciler:
    """Leader-only loop driving replicas towards the catalog."""

    def __init__(
        self,
        store: Store,
        fleet: Fleet,
        *,
        interval_s: float = 2.0,
        backoff_s: float = 2.0,
        backoff_max_s: float = 60.0,
        in_flight: Callable[[str], int] = lambda model: 0,
        on_catalog: Callable[[list[ModelDefinition]], None] = lambda models: None,
        clock: Callable[[], float] = time.monotonic,
        may_act: Callable[[], bool] = lambda: True,
        demand: ModelDemand | None = None,
        on_stopped: Callable[[bool], None] = lambda stopped: None,
        on_pass: Callable[[float], None] = lambda seconds: None,
        tracing: Tracing = TRACING_OFF,
        load: Callable[[str], ModelLoad] = lambda model: ModelLoad(),
        drain: Callable[[str], None] = lambda replica_id: None,
        replica_in_flight: Callable[[str], int] = lambda replica_id: 0,
    ) -> None:
        self._tracing = tracing
        self._trace = NO_PASS
        self.training_holds: Callable[[], Sequence[TrainingHold]] = lambda: ()
        """The cards and host memory training jobs hold (TrainingScheduler.holds): no replica goes there."""
        self.starts = ReplicaStarts(tracing)
        """Each replica's open start span, closed when its node reports it ready (:meth:`observed`)."""
        self._store = store
        self._may_act = may_act
        self._fleet = fleet
        self._interval_s = interval_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._in_flight = in_flight
        self._load = load
        """The gateway's view of a model's load (autoscaling's input)."""
        self._drain = drain
        """Tell the gateway to send a replica no new request."""
        self._replica_in_flight = replica_in_flight
        """Requests the gateway has on a replica, draining or not."""
        self._scaling: dict[str, ScalingHistory] = {}
        self.scaling: dict[str, str] = {}
        """Each model's last scaling decision, in words."""
        self.evictions: dict[str, str] = {}
        """Each model's last eviction decision, in words (the log says it too)."""
        self._on_catalog = on_catalog
        self._clock = clock
        demand = demand if demand is not None else ModelDemand(clock)
        self._wake = demand.woken
        self._last_used = demand.last_used
        self._on_stopped = on_stopped
        self._on_pass = on_pass
        """Told each pass's duration in seconds (the reconcile-duration metric)."""
        self._stopped = False
        self.last_error = ""
        self.unplaced: dict[str, str] = {}
        """Models that could not be placed, with every node's reason."""
        self._definitions: dict[str, ModelDefinition] = {}
        """The catalog as last read: the priorities eviction compares."""
        self._catalog: dict[str, object] = {}
        self._members: dict[str, tuple[str, ...]] = {}
        """Each environment entry's members, whose demand and load count as the entry's."""
        """The definitions last loaded: a catalog loaded with something new is told to the fleet's changes."""
        self._free: FreeCards | None = None
        """The fleet's free cards, built at a pass's first placement and kept up to date by the pass's own
        placements (a pass that places a thousand replicas looks at the best node first, not at every one)."""
        self._parsed: dict[str, tuple[object, ModelDefinition]] = {}
        """Each model's definition as stored and as parsed (frozen), last pass: parsing 500 models takes
        longer than the rest of a pass, and a definition rarely changes."""
        self._surges: dict[str, str] = {}
        """Per model, the replica a roll placed beyond its count (:mod:`.adapterrolling`): not counted
        by autoscaling until an old replica drains in its place."""

    @property
    def stopped(self) -> bool:
        """``serving.stopped`` as of the last pass: every model wants no replicas (``llmgw stop``)."""
        return self._stopped

    @stopped.setter
    def stopped(self, stopped: bool) -> None:
        if stopped != self._stopped:
            self._fleet.changes.changed("serving")
        self._stopped = stopped
        self._on_stopped(stopped)  # the gateway refuses requests while stopped

    # signals from elsewhere --------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def demand(self, model: str) -> None:
        """A request wants ``model`` and no replica is ready: keep (or start) one."""
        self._last_used[model] = self._clock()
        self.wake()

    def used(self, model: str) -> None:
        self._last_used[model] = self._clock()

    def observed(self, replica: ReplicaState) -> None:
        """A replica's node reported its state: a start ends when it serves or fails."""
        if replica.replica_id in self.starts and replica.state in (ReplicaPhase.READY, ReplicaPhase.FAILED):
            self.starts.end(replica.replica_id, replica.error if replica.state is ReplicaPhase.FAILED else "")

    def failed(self, replica: ReplicaState) -> None:
        delay = min(self._backoff_max_s, self._backoff_s * (2**replica.backoff.attempts))
        replica.backoff.attempts += 1
        replica.next_start = self._clock() + delay
        log.warning(
            "replica %s of %s failed (%s); starting it again in %.0f s",
            replica.replica_id,
            replica.model,
            replica.error or "no reason given",
            delay,
        )
        self.wake()

    def _set_unplaced(self, model: str, reasons: str) -> None:
        """Record why ``model`` cannot be placed (empty: it can); a new verdict changes its view."""
        if self.unplaced.get(model, "") == reasons:
            return
        if reasons:
            self.unplaced[model] = reasons
        else:
            del self.unplaced[model]
        self._fleet.changes.changed("models")

    # the loop -----------------------------------------------------------------
    async def run(self, may_act: Callable[[], bool] | None = None) -> None:
        """Pass every ``interval_s`` (or when woken) while ``may_act`` says this process leads.

        Only the store's errors are caught here; anything else ends the run, and the
        process supervisor logs it and runs the reconciler again.
        """
        may_act = may_act or self._may_act
        self._fleet.restart_grace()  # leading (again): nodes away until now get their grace anew
        while True:
            try:
                if may_act():  # leads now (the loop is also stopped the moment the lease is lost)
                    started = time.perf_counter()
                    await self.pass_once()
                    self._on_pass(time.perf_counter() - started)
                self.last_error = ""
            except LlmgwError as error:
                self.last_error = str(error)
                log.warning("reconcile pass failed: %s", error)
            self._wake.clear()
            wait_s = self._interval_s
            loss_s = self._fleet.next_loss_s()  # pass again as soon as an away node is lost
            if loss_s is not None:
                wait_s = min(wait_s, max(loss_s, 0.01))
            try:
                await asyncio.wait_for(self._wake.wait(), wait_s)
            except TimeoutError:
                pass

    async def load_catalog(self) -> dict[str, ModelDefinition]:
        """Read the catalog and hand it to ``on_catalog`` (the gateway's model list)."""
        models: dict[str, ModelDefinition] = {}
        records = await self._store.models.list()
        catalog = {record.name: (record.owner, record.definition) for record in records}
        if catalog != self._catalog:
            self._catalog = dict(catalog)
            self._fleet.changes.changed("models")
        parsed: dict[str, tuple[object, ModelDefinition]] = {}
        for record in records:
            known = self._parsed.get(record.name)
            if known is not None and known[0] == record.definition:  # unchanged: parsed once, not every pass
                models[record.name] = known[1]
                parsed[record.name] = known
                continue
            try:
                models[record.name] = parse_model(record.definition)
            except LlmgwError as error:
                log.error("model %s in the store cannot be read: %s", record.name, error)
            else:
                parsed[record.name] = (record.definition, models[record.name])
        self._parsed = parsed
        stored = {name: m for name, m in models.items() if is_entry(m)}
        models = {name: m for name, m in models.items() if name not in stored}
        self._on_catalog(list(models.values()))  # the gateway knows members, and which entry serves each
        expanded = expand_environments(models)
        for environment, why in expanded.refusals.items():
            self._set_unplaced(entry_name(environment), why)
        await self._keep_entries(stored, expanded.placed)
        self._members = expanded.members
        self._definitions = expanded.placed
        return expanded.placed

    async def _keep_entries(
        self, stored: dict[str, ModelDefinition], placed: dict[str, ModelDefinition]
    ) -> None:
        """Store each environment's entry as it is now (its replicas' rows name it) and remove
        the entries of environments gone (their replicas go with them)."""
        for name, model in placed.items():
            if is_entry(model) and stored.get(name) != model:
                await self._store.models.put(name, model.model_dump(mode="json", exclude_defaults=True))
        for name in stored.keys() - placed.keys():
            with contextlib.suppress(NotFound):
                await self._store.models.remove(name)

    async def load(self) -> tuple[dict[str, ModelDefinition], list[ReplicaRecord]]:
        """Read the desired state: the catalog (handed to the gateway) and the replicas placed,
        which the fleet tracks from then on. A new leader does this before it accepts agents,
        so the shards they report are adopted, never taken for strays."""
        self.stopped = await self._store.settings.get(SERVING_STOPPED, False) is True  # a JSON bool only
        models = await self.load_catalog()
        placed = await self._store.replicas.list()
        for replica_record in placed:
            if replica_record.id not in self._fleet.replicas:
                model = models.get(replica_record.model)
                profile = profile_of(model, replica_record.profile) if model else None
                self._fleet.track(
                    ReplicaState(
                        replica_id=replica_record.id,
                        model=replica_record.model,
                        node_id=replica_record.node_id,
                        api_key=replica_record.api_key,
                        capacity=profile.parallel if profile else 1,
                        engine=profile.engine if profile else DEFAULT_ENGINE,
                        state=ReplicaPhase.ABSENT,
                        profile=replica_record.profile,
                        nodes=profile.nodes if profile else 1,
                        rank=multinode.rank_of(replica_record.id)[1],
                    )
                )
        for replica in self._fleet.replicas.values():
            if not replica.blobs and replica.model in models:  # placed before a failover: its files
                replica.blobs = shard_blobs(shard_spec(replica, models[replica.model]))
        return models, placed

    async def pass_once(self) -> None:
        if self._tracing.enabled:
            self._trace = PassTrace(self._tracing)
        self._free = None
        try:
            models, placed = await self.load()
            wanted = {p.id for p in placed}
            for replica in [r for r in self._fleet.replicas.values() if r.replica_id not in wanted]:
                await self._remove(replica, "its model left the catalog")
            for model in sorted(models.values(), key=lambda m: -m.priority):  # room goes to the higher first
                await self._reconcile_model(model, placed)
            await self._finish_drains(models, placed)
        finally:
            self._free = None
            self._trace.end()
            self._trace = NO_PASS

    def _demanded(self, model: ModelDefinition) -> bool:
        names = (model.name, *self._members.get(model.name, ()))  # an environment's members count as it
        if sum(self._in_flight(name) for name in names) > 0:
            self._last_used[model.name] = self._clock()
            return True
        used = [at for name in names if (at := self._last_used.get(name)) is not None]
        return bool(used) and self._clock() - max(used) < model.idle_timeout_s

    def _model_load(self, name: str) -> ModelLoad:
        """The gateway's view of ``name``'s load, an environment's members' requests added to its entry's."""
        load = self._load(name)
        for member in self._members.get(name, ()):
            theirs = self._load(member)
            load = dataclasses.replace(
                load, running=load.running + theirs.running, waiting=load.waiting + theirs.waiting
            )
        return load

    async def _reconcile_model(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> None:
        await self._take_down_broken(model, placed)
        every = [r for r in self._fleet.of_model(model.name) if r.rank == 0]  # a replica is its head
        mine = [r for r in every if r.draining_since is None]
        floor = 0 if self.stopped else min(model.wanted_replicas(self._demanded(model)), model.replicas.max)
        counted = [r for r in mine if r.replica_id != self._surges.get(model.name)]  # a roll's extra one
        want = self._scale(model, floor, counted) if floor else 0
        if len(mine) >= want:
            self._set_unplaced(model.name, "")
        if len(counted) != want:
            self._trace.action(
                "scale", {"llmgw.model": model.name, "llmgw.from": len(counted), "llmgw.to": want}
            )
        if not want:  # stopped, or idle on demand: nothing is asked of it, so it stops now
            for replica in every:
                await self._remove(replica, "serving is stopped" if self.stopped else "idle")
            return
        old = adapterrolling.stale(model, mine)
        if not old:
            self._surges.pop(model.name, None)
        if old and len(mine) >= want:
            await self._roll(model, mine, old, want, placed)
        elif len(mine) > want:
            for replica in sorted(mine, key=lambda r: r.state.worth)[: len(mine) - want]:
                self.drain(replica, f"scaled down: {self.scaling.get(model.name, 'no longer wanted')}")
            return
        for _ in range(want - len(mine)):
            if not await self._place(model, placed):
                break
        await self._replace_lost(model, placed)
        now = self._clock()
        for replica in self._fleet.of_model(model.name):
            if replica.node_id not in self._fleet.nodes or replica.nodes > 1:
                continue  # a multi-node replica starts whole when placed, and is placed again whole
            if replica.state is ReplicaPhase.ABSENT or (
                replica.state is ReplicaPhase.FAILED and now >= replica.next_start
            ):
                await self._start(
                    replica, model, why="restart" if replica.state is ReplicaPhase.FAILED else "resent"
                )

    async def _replace_lost(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> None:
        """Place each replica of ``model`` on a lost node again elsewhere, then forget the old one.

        A replica no other node can take stays where it is, so the node coming back resumes it.
        """
        for replica in self._fleet.of_model(model.name):
            if not self._fleet.lost(replica.node_id) or replica.nodes > 1:
                continue
            if not await self._place(model, placed):
                return
            log.warning(
                "node %s gone for %.0f s (more than %.0f s): replica %s of %s placed again elsewhere",
                replica.node_id,
                self._fleet.away_for(replica.node_id),
                self._fleet.node_grace_s,
                replica.replica_id,
                model.name,
            )
            self._fleet.moved_away(replica)
            self.starts.end(replica.replica_id, f"node {replica.node_id} lost")
            self._trace.action(
                "replica.move", {"llmgw.replica": replica.replica_id, "llmgw.node": replica.node_id}
            )
            placed[:] = [p for p in placed if p.id != replica.replica_id]
            self._free = None
            try:
                await self._store.replicas.remove(replica.replica_id)
            except NotFound:
                pass

    async def _take_down_broken(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> None:
        """Stop every shard of each multi-node replica of ``model`` that lost one; it is placed again."""
        heads = {multinode.rank_of(r.replica_id)[0] for r in self._fleet.of_model(model.name) if r.nodes > 1}
        for replica_id in sorted(heads):
            shards = multinode.shards_of(self._fleet, replica_id)
            why = multinode.broken(self._fleet, shards)
            if not why:
                continue
            log.warning("multi-node replica %s of %s is taken down: %s", replica_id, model.name, why)
            for shard in shards:
                await self._remove(shard, f"replica {replica_id} taken down: {why}")
            placed[:] = [p for p in placed if multinode.rank_of(p.id)[0] != replica_id]
            self._free = None

    def _scale(self, model: ModelDefinition, floor: int, mine: list[ReplicaState]) -> int:
        """The count autoscaling keeps for ``model`` now (at least ``floor``), logged when it changes."""
        policy = ScalingPolicy(
            min=floor,
            max=max(floor, model.replicas.max),
            ttft_target_ms=model.replicas.ttft_target_ms,
            up_cooldown_s=model.replicas.scale_up_cooldown_s,
            down_cooldown_s=model.replicas.scale_down_cooldown_s,
        )
        starting = sum(1 for r in mine if r.state is not ReplicaPhase.READY)
        decision = decide_scale(
            policy,
            len(mine),
            self._model_load(model.name),
            self._scaling.get(model.name, ScalingHistory()),
            self._clock(),
            starting=starting,
        )
        self._scaling[model.name] = decision.history
        self.scaling[model.name] = decision.reason
        if decision.replicas != len(mine) and mine:
            log.info("scaling %s: %s", model.name, decision.reason)
        return decision.replicas

    async def _roll(
        self,
        model: ModelDefinition,
        mine: list[ReplicaState],
        old: list[ReplicaState],
        want: int,
        placed: list[ReplicaRecord],
    ) -> None:
        """One step of replacing the replicas started with other adapters (:mod:`.adapterrolling`)."""
        step = adapterrolling.roll_step(mine, old, want)
        if step.surge:
            before = {r.replica_id for r in self._fleet.of_model(model.name)}
            if self.decide(model, placed).placed and await self._place(model, placed):
                added = [r.replica_id for r in self._fleet.of_model(model.name) if r.rank == 0]
                self._surges[model.name] = next(r for r in added if r not in before)  # not for scaling
                return
            worst = min(old, key=lambda r: r.state.worth)  # no room beside it: replaced in place
            step = adapterrolling.RollStep(drain=(worst,))
        for replica in step.drain:
            self.drain(replica, adapterrolling.why_drained(model, replica))
            self._surges.pop(model.name, None)  # the extra one took its place

    def drain(self, replica: ReplicaState, reason: str) -> None:
        """Send ``replica`` no new request; a pass stops it once its requests are done."""
        if replica.draining_since is not None:
            return
        log.info("draining replica %s of %s: %s", replica.replica_id, replica.model, reason)
        self._trace.action("replica.drain", {"llmgw.replica": replica.replica_id, "llmgw.why": reason})
        replica.draining_since = self._clock()
        replica.drain_reason = reason
        self._drain(replica.replica_id)
        self._fleet.changes.changed("replicas")

    async def _finish_drains(self, models: dict[str, ModelDefinition], placed: list[ReplicaRecord]) -> None:
        """Stop each draining replica whose requests are done, or whose drain timed out."""
        now = self._clock()
        for replica in [r for r in self._fleet.replicas.values() if r.draining_since is not None]:
            model = models.get(replica.model)
            timeout_s = model.replicas.drain_timeout_s if model else 0.0
            left = self._replica_in_flight(replica.replica_id)
            if left and now - (replica.draining_since or now) < timeout_s:
                continue
            ended = f"{left} request(s) still on it after {timeout_s:.0f} s" if left else "drained"
            await self._remove(replica, f"{replica.drain_reason} ({ended})")
            placed[:] = [p for p in placed if p.id != replica.replica_id]
            self._free = None

    async def _place(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> bool:
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
                self._trace.placed(model.name, decision)
            self._set_unplaced(model.name, reasons)
            return False
        self._set_unplaced(model.name, "")
        self.evictions.pop(model.name, None)
        self._trace.placed(model.name, decision)
        profile = model.profiles[decision.profile]
        replica_id, api_key = f"{_slug(model.name)}-{secrets.token_hex(3)}", replica_key()
        where = [(decision.node_id, decision.devices), *((s.node_id, s.devices) for s in decision.more)]
        shards: list[tuple[ReplicaState, tuple[int, ...]]] = []
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
            await self._store.replicas.add(record)
            placed.append(record)
            if self._free is not None:
                self._free.add(self._placed(record))
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
            shards.append((replica, tuple(devices)))
        on = f" with profile {decision.profile + 1}" if len(model.profiles) > 1 else ""
        nodes = ", ".join(node_id for node_id, _ in where)
        log.info("placed replica %s of %s on %s%s", replica_id, model.name, nodes, on)
        for replica, devices in shards:
            await self._start(replica, model, devices, why="placed")
        return True

    def _from_index(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> Decision | None:
        """Where the index of free cards puts one more replica of ``model`` (its first profile, on a node
        without one); None when it cannot tell, and every node is weighed (:meth:`decide`)."""
        if self._free is None:
            nodes = withheld([n.inventory for n in self._fleet.nodes.values()], self.training_holds())
            self._free = FreeCards(nodes, [self._placed(r) for r in placed])
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
                    self.drain(victim, f"evicted for {model.name} (priority {model.priority})")
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
        nodes = withheld([n.inventory for n in self._fleet.nodes.values()], self.training_holds())
        asks = [Ask(model.memory_needed_mb(p), p.spread, p.gpu_class) for p in model.profiles]
        held = [self._placed(r) for r in placed]
        if unplaced is None:
            return place_profiles(model.name, asks, nodes, held)
        return plan_eviction(
            model.name, model.priority, asks, nodes, held, unplaced, environment=environment_of(model)
        )

    def _placed(self, record: ReplicaRecord) -> Placed:
        replica = self._fleet.replicas.get(record.id)
        definition = self._definitions.get(record.model)
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

    async def _start(
        self, replica: ReplicaState, model: ModelDefinition, devices: tuple[int, ...] = (), *, why: str
    ) -> None:
        node = self._fleet.nodes.get(replica.node_id)
        if node is None:
            return
        together = multinode.rendezvous(self._fleet, replica)
        if replica.nodes > 1 and together is None:
            return  # its head's node is away: the replica is taken down and placed again
        start = shard_spec(replica, model, devices, rendezvous=together)
        if self._tracing.enabled:
            context = self.starts.begin(self._trace, replica.replica_id, model.name, replica.node_id, why)
            start = dataclasses.replace(start, traceparent=context)
        replica.blobs = shard_blobs(start)  # what its node may fetch from the mirror
        replica.adapters = tuple(adapter.name for adapter in start.adapters)
        replica.state = ReplicaPhase.STARTING
        self._fleet.changes.changed("replicas")
        try:
            await node.channel.send(start)
        except ChannelClosed:
            replica.state = ReplicaPhase.ABSENT
            self.starts.end(replica.replica_id, "its node's stream closed")

    async def _remove(self, replica: ReplicaState, reason: str) -> None:
        if replica.nodes > 1 and replica.rank == 0:  # a multi-node replica stops whole
            for shard in multinode.shards_of(self._fleet, replica.replica_id)[1:]:
                await self._remove(shard, reason)
        node = self._fleet.nodes.get(replica.node_id)
        log.info("stopping replica %s of %s: %s", replica.replica_id, replica.model, reason)
        self.starts.end(replica.replica_id, f"stopped: {reason}")
        self._trace.action("replica.stop", {"llmgw.replica": replica.replica_id, "llmgw.why": reason})
        self._fleet.forget(replica.replica_id)
        try:
            await self._store.replicas.remove(replica.replica_id)
        except NotFound:
            pass
        if node is not None:
            try:
                await node.channel.send(StopShard(replica_id=replica.replica_id, reason=reason))
            except ChannelClosed:
                pass


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:40] or "model"
