"""The reconciler: make the replicas running match what the catalog asks for.

Each pass reads the catalog and the replicas placed (desired state, in the
store) and the fleet (observed state, in memory), then decides each model's
count between ``replicas.min`` and ``max`` from the load the gateway sees
(:mod:`.replicacount`), places new replicas (:mod:`.placing`: the model's
profiles tried in order; a replica that fits nowhere evicts lower-priority
replicas; the pass's placements written in one transaction, then started),
starts the ones their node is not running, restarts failed ones with backoff,
drains the ones no longer wanted and stops idle on-demand models. A replica
drains before it stops: the gateway sends it no new request at once, and its
node is told to stop it once the requests on it have finished or
``replicas.drain_timeout_s`` has passed since the drain began. Each drain is
written to the store in the pass that began it, and a new leader drains on
the replicas the last one was draining (:mod:`.underway`, :meth:`Reconciler.take_over`). A replica
whose node has been away past the fleet's grace is placed again on another
node (a new replica, with its own key) and the old one forgotten; the node,
should it come back, is told to stop the stray engine.

With tracing on, a pass that does something is a trace and each replica's
start a span until it serves (:mod:`llmgw.controlplane.replicas.reconciletracing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState, shard_blobs
from llmgw.controlplane.replicas import adapterrolling, multinode
from llmgw.controlplane.replicas.demand import ModelDemand
from llmgw.controlplane.replicas.placing import PLACEMENTS_PER_PASS, Placer
from llmgw.controlplane.replicas.reconciletracing import NO_PASS, PassTrace, ReplicaStarts
from llmgw.controlplane.replicas.replicacount import ReplicaCount
from llmgw.controlplane.replicas.shardspecs import profile_of, shard_spec
from llmgw.controlplane.replicas.underway import UnderWay
from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.core.environments import entry_name, expand_environments, is_entry
from llmgw.core.placement import Decision
from llmgw.core.scaling import ModelLoad
from llmgw.core.settingtypes import SERVING_STOPPED
from llmgw.core.shards import ReplicaPhase, StopShard
from llmgw.core.trainingplacement import TrainingHold
from llmgw.errors import ChannelClosed, LlmgwError, NotFound
from llmgw.observability.tracing import TRACING_OFF, Tracing
from llmgw.runtime.waiting import wait_event
from llmgw.store.database import Store
from llmgw.store.replicas import ReplicaRecord

log = logging.getLogger(__name__)


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
        placements_per_pass: int = PLACEMENTS_PER_PASS,
        training_holds: Callable[[], Sequence[TrainingHold]] = lambda: (),
    ) -> None:
        self._tracing = tracing
        self._trace = NO_PASS
        self.training_holds = training_holds
        """The cards and host memory training jobs hold (TrainingScheduler.holds): no replica goes there."""
        self.starts = ReplicaStarts(tracing)
        """Each replica's open start span, closed when its node reports it ready (:meth:`observed`)."""
        self._store = store
        self._may_act = may_act
        self._fleet = fleet
        self._interval_s = interval_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._drain = drain
        """Tell the gateway to send a replica no new request."""
        self._replica_in_flight = replica_in_flight
        """Requests the gateway has on a replica, draining or not."""
        self._on_catalog = on_catalog
        self._clock = clock
        demand = demand if demand is not None else ModelDemand(clock)
        self._wake = demand.woken
        self._last_used = demand.last_used
        self._count = ReplicaCount(clock=clock, in_flight=in_flight, load=load, last_used=demand.last_used)
        self._on_stopped = on_stopped
        self._on_pass = on_pass
        """Told each pass's duration in seconds (the reconcile-duration metric)."""
        self._stopped = False
        self.last_error = ""
        self._definitions: dict[str, ModelDefinition] = {}
        """The catalog as last read: the priorities eviction compares."""
        self._catalog: dict[str, object] = {}
        """The definitions last loaded: a catalog loaded with something new is told to the fleet's changes."""
        self._placer = Placer(
            fleet,
            definitions=lambda: self._definitions,
            training_holds=lambda: self.training_holds(),
            drain=self.drain,
            per_pass=placements_per_pass,
        )
        self._parsed: dict[str, tuple[object, ModelDefinition]] = {}
        """Each model's definition as stored and as parsed (frozen), last pass: parsing 500 models takes
        longer than the rest of a pass, and a definition rarely changes."""
        self._under_way = UnderWay(store, clock)
        """The drains begun, written to the store as each pass ends; read back by :meth:`take_over`."""
        self._surges: dict[str, str] = {}
        """Per model, the replica a roll placed beyond its count (:mod:`.adapterrolling`): not counted
        by autoscaling until an old replica drains in its place."""

    @property
    def unplaced(self) -> dict[str, str]:
        """Models that could not be placed, with every node's reason."""
        return self._placer.unplaced

    @property
    def more_to_place(self) -> bool:
        """The last pass placed as many replicas as one may (PLACEMENTS_PER_PASS) and left some."""
        return self._placer.more

    @property
    def scaling(self) -> dict[str, str]:
        """Each model's last scaling decision, in words."""
        return self._count.scaling

    @property
    def evictions(self) -> dict[str, str]:
        """Each model's last eviction decision, in words (the log says it too)."""
        return self._placer.evictions

    def decide(
        self, model: ModelDefinition, placed: list[ReplicaRecord], *, unplaced: Decision | None = None
    ) -> Decision:
        """Where one more replica of ``model`` would go now (:meth:`.placing.Placer.decide`)."""
        return self._placer.decide(model, placed, unplaced=unplaced)

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

    # the loop -----------------------------------------------------------------
    async def run(self, may_act: Callable[[], bool] | None = None) -> None:
        """Pass every ``interval_s`` (or when woken) while ``may_act`` says this process leads.

        Only the store's errors are caught here; anything else ends the run, and the
        process supervisor logs it and runs the reconciler again.
        """
        may_act = may_act or self._may_act
        self._fleet.restart_grace()  # leading (again): nodes away until now get their grace anew
        while True:
            more = False
            try:
                if may_act():  # leads now (the loop is also stopped the moment the lease is lost)
                    started = time.perf_counter()
                    await self.pass_once()
                    self._on_pass(time.perf_counter() - started)
                    more = self._placer.more
                self.last_error = ""
            except LlmgwError as error:
                self.last_error = str(error)
                log.warning("reconcile pass failed: %s", error)
            self._wake.clear()
            if more:  # the pass placed as many as one may, and was written: the next one at once
                await asyncio.sleep(0)
                continue
            wait_s = self._interval_s
            loss_s = self._fleet.next_loss_s()  # pass again as soon as an away node is lost
            if loss_s is not None:
                wait_s = min(wait_s, max(loss_s, 0.01))
            await wait_event(self._wake, wait_s)

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
            self._placer.set_unplaced(entry_name(environment), why)
        await self._keep_entries(stored, expanded.placed)
        self._count.members = expanded.members
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

    async def take_over(self) -> None:
        """Read the desired state (:meth:`load`), then carry on what the last leader was in the
        middle of: each replica it was draining drains on here (the gateway sends it no new
        request; its drain timeout counts from when the drain began), and each adapter roll goes on
        with the surge it had placed. A control plane about to
        lead does this before it accepts agents, so a draining replica reported ready is not routed to."""
        await self.load()
        draining, self._surges = await self._under_way.restore(self._fleet)
        for replica in draining:
            self._drain(replica.replica_id)
        self._fleet.changes.changed("replicas")

    async def pass_once(self) -> None:
        if self._tracing.enabled:
            self._trace = PassTrace(self._tracing)
        self._placer.begin_pass()
        try:
            models, placed = await self.load()
            wanted = {p.id for p in placed}
            for replica in [r for r in self._fleet.replicas.values() if r.replica_id not in wanted]:
                await self._remove(replica, "its model left the catalog")
            for model in sorted(models.values(), key=lambda m: -m.priority):  # room goes to the higher first
                await self._reconcile_model(model, placed)
            await self._placer.flush(self._store, self._start_placed)  # one transaction, then the starts
            await self._under_way.save(self._surges)  # the drains this pass began, before any stops
            await self._finish_drains(models, placed)
        finally:
            self._placer.abandon()  # a pass that failed before its placements were written
            self._placer.forget_index()
            self._trace.end()
            self._trace = NO_PASS

    async def _reconcile_model(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> None:
        await self._take_down_broken(model, placed)
        every = [r for r in self._fleet.of_model(model.name) if r.rank == 0]  # a replica is its head
        mine = [r for r in every if r.draining_since is None]
        floor = (
            0 if self.stopped else min(model.wanted_replicas(self._count.demanded(model)), model.replicas.max)
        )
        counted = [r for r in mine if r.replica_id != self._surges.get(model.name)]  # a roll's extra one
        want = self._count.scale(model, floor, counted) if floor else 0
        if len(mine) >= want:
            self._placer.set_unplaced(model.name, "")
        if len(counted) != want:
            self._trace.action(
                "scale", {"llmgw.model": model.name, "llmgw.from": len(counted), "llmgw.to": want}
            )
        if not want:  # stopped, or idle on demand: nothing is asked of it, so it stops now
            for replica in every:
                await self._remove(replica, "serving is stopped" if self.stopped else "idle")
            return
        old = adapterrolling.stale(model, mine)
        surge = self._surges.get(model.name)
        if surge is not None and all(r.replica_id != surge for r in mine):
            del self._surges[model.name]  # it went (stopped, drained, moved): no extra one now
            surge = None
        # Taken over mid-roll: until every replica's adapters are known (reported ready, or sent
        # again), which are old cannot be told, and the extra one is neither counted nor drained.
        waiting = surge is not None and adapterrolling.unknown(mine)
        if not old and not waiting:
            self._surges.pop(model.name, None)
        if old and len(mine) >= want:
            await self._roll(model, mine, old, want, placed)
        elif len(mine) > want and not waiting:
            for replica in sorted(mine, key=lambda r: r.state.worth)[: len(mine) - want]:
                self.drain(replica, f"scaled down: {self._count.scaling.get(model.name, 'no longer wanted')}")
            return
        for _ in range(want - len(mine)):
            if not self._placer.place(model, placed, self._trace):
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
            elif replica.state is ReplicaPhase.READY and adapterrolling.runtime_behind(model, replica):
                await self._send_adapters(replica, model, placed)

    async def _send_adapters(
        self, replica: ReplicaState, model: ModelDefinition, placed: list[ReplicaRecord]
    ) -> None:
        """Send a running replica that loads adapters at run time its start again, with the model's
        adapters as they are now: its agent fetches the new ones and reports where they are."""
        node = self._fleet.nodes.get(replica.node_id)
        if node is None:
            return
        devices = next((tuple(p.devices) for p in placed if p.id == replica.replica_id), ())
        start = shard_spec(replica, model, devices)
        replica.blobs = shard_blobs(start)
        replica.adapters = tuple(adapter.name for adapter in start.adapters)
        log.info(
            "replica %s of %s: sent its adapters %s", replica.replica_id, model.name, list(replica.adapters)
        )
        with contextlib.suppress(ChannelClosed):
            await node.channel.send(start)

    async def _replace_lost(self, model: ModelDefinition, placed: list[ReplicaRecord]) -> None:
        """Place each replica of ``model`` on a lost node again elsewhere, then forget the old one.

        A replica no other node can take stays where it is, so the node coming back resumes it.
        """
        for replica in self._fleet.of_model(model.name):
            if not self._fleet.lost(replica.node_id) or replica.nodes > 1:
                continue
            if not self._placer.place(model, placed, self._trace):
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
            self._placer.forget_index()
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
            self._placer.forget_index()

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
        if step.surge and self._placer.spent():
            return  # the next pass, at once, places the extra one: none is drained without it
        if step.surge:
            before = {r.replica_id for r in self._fleet.of_model(model.name)}
            if self.decide(model, placed).placed and self._placer.place(model, placed, self._trace):
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
        self._under_way.drain_begun(replica)
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
            self._placer.forget_index()

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

    async def _start_placed(
        self, replica: ReplicaState, model: ModelDefinition, devices: tuple[int, ...]
    ) -> None:
        await self._start(replica, model, devices, why="placed")

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
