"""The leader's observed state: connected nodes and what each replica is doing.

Desired state (the catalog, which replica goes where) lives in the store;
this is rebuilt from agents' registrations after a restart or failover.

A node without a session is *away* from the moment its stream ended (or,
for a node this leader never saw, from when it first tracked one of its
replicas). For ``node_grace_s`` its ready replicas stay routable, since its
engines outlive an agent restart; past that it is *lost*: the reconciler
moves its replicas to other nodes, and the replicas it moved are remembered
so that, should the node come back, the engines it still runs for them are
stopped as strays and never adopted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmgw.controlplane.admin.changes import Changes
from llmgw.controlplane.nodes.logreading import LogRequests
from llmgw.core.backoff import Backoff
from llmgw.core.devices import NodeInventory
from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.core.nodes import NodeRegistration, SettingsRefusal
from llmgw.core.shards import Compute, FetchProgress, ReplicaPhase, ShardSpec, ShardState
from llmgw.core.telemetry import Telemetry
from llmgw.errors import Unauthorized
from llmgw.protocol.links import ControlLink

log = logging.getLogger(__name__)


@dataclass
class NodeState:
    inventory: NodeInventory
    channel: ControlLink
    engines: tuple[str, ...] = ()
    refused_settings: SettingsRefusal | None = None
    """Settings the node's agent could not start on, as it registered (it runs on its last good ones)."""
    connected_at: float = field(default_factory=time.time)
    last_heard: float = field(default_factory=time.monotonic)
    agent_version: str = ""
    foreign: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Each card's processes that are not llmgw's, by name, from the last telemetry (training placement)."""


@dataclass
class ReplicaState:
    """One replica as the leader sees it."""

    replica_id: str
    model: str
    node_id: str
    api_key: str = field(repr=False)
    capacity: int = 1
    engine: str = DEFAULT_ENGINE
    """The engine the replica runs: the router reads its load by that engine's metric names."""
    state: ReplicaPhase = ReplicaPhase.PLACED
    port: int = 0
    error: str = ""
    restarts: int = 0
    compute: str = ""
    next_start: float = 0.0
    backoff: Backoff = field(default_factory=Backoff)
    adapter_paths: dict[str, str] = field(default_factory=dict)
    """Each LoRA adapter's folder or file on the replica's node, by name, as its agent reported."""
    adapters: tuple[str, ...] | None = None
    """The adapters its node was sent when it was last started (the catalog's then); None: not
    known yet (taken over from another control plane; the agent's report of it ready says)."""
    blobs: frozenset[str] = frozenset()
    """The sha256 of every mirrored file its shard fetches (:func:`shard_blobs`): what its node may fetch."""
    profile: int = 0
    """The index of its model's profile it runs."""
    draining_since: float | None = None
    """When it began draining (scaled down or evicted: no new requests); None while it serves."""
    drain_reason: str = ""
    fetching: FetchProgress | None = None
    kv_block_size: int = 0
    """Tokens per KV block as its engine's events say (0: unknown, or no KV events)."""
    kv_mismatch: str = ""
    """Why its engine's block hashes disagree with llmgw's (KV-aware routing cannot find its blocks)."""
    """While starting: how far its node has fetched its files, as last reported."""
    nodes: int = 1
    """Nodes its replica spans (:mod:`llmgw.controlplane.replicas.multinode`); 1: a one-node replica."""
    rank: int = 0
    """Its rank among its replica's shards: only rank 0 (the head) serves, so only it is routed to."""


def shard_blobs(spec: ShardSpec) -> frozenset[str]:
    """Every mirrored file a shard fetches: weights, the repository's other files, projector, adapters."""
    found = {spec.weights_sha256, spec.projector_sha256, *(f.sha256 for f in spec.files)}
    for adapter in spec.adapters:
        found |= {adapter.sha256, *(f.sha256 for f in adapter.files)}
    return frozenset(found - {""})


class Fleet:
    """Connected nodes and replica states, with hooks the gateway's table follows."""

    def __init__(
        self,
        on_ready: Callable[[ReplicaState, str], None],
        on_gone: Callable[[str], None],
        node_grace_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        changes: Changes | None = None,
    ) -> None:
        self.changes = changes if changes is not None else Changes()
        """Told when a node attaches or goes and when a replica is tracked, changes state or is forgotten."""
        self.node_grace_s = node_grace_s
        """How long a gone node's ready replicas stay routable: its engines outlive an agent restart.
        Past it the node is lost and its replicas are placed elsewhere."""
        self.nodes: dict[str, NodeState] = {}
        self.replicas: dict[str, ReplicaState] = {}
        """Every replica tracked, by id: :meth:`track` and :meth:`forget` are the only ways in and out."""
        self._by_model: dict[str, dict[str, ReplicaState]] = {}
        """The same replicas by model (a pass asks for each model's: linear, not quadratic, at scale)."""
        self.away_since: dict[str, float] = {}
        """Nodes without a session that replicas are placed on, with when (``clock``) they went away."""
        self.release_blobs: dict[str, frozenset[str]] = {}
        """The files of a release each node is upgrading to (``ctl upgrade agents``): it may fetch them."""
        self.moved: dict[str, str] = {}
        """Replicas moved off a lost node, by id, with that node: its engine there is a stray."""
        self._clock = clock
        self.logs = LogRequests()
        """Requests for shards' logs waiting on their nodes' answers."""
        self._on_ready = on_ready
        self._on_gone = on_gone

    # nodes -----------------------------------------------------------------
    def attach(self, registration: NodeRegistration, channel: ControlLink) -> NodeState | None:
        """Record a node's new session; returns the session it replaces, if any."""
        old = self.nodes.get(registration.node_id)
        self.away_since.pop(registration.node_id, None)
        self.nodes[registration.node_id] = NodeState(
            inventory=registration.inventory,
            channel=channel,
            engines=registration.engines,
            refused_settings=registration.refused_settings,
            agent_version=registration.agent_version,
        )
        self.changes.changed("nodes")
        return old

    def detach(self, node_id: str, channel: ControlLink) -> bool:
        """Forget a node whose session ended (unless a newer session replaced it)."""
        node = self.nodes.get(node_id)
        if node is None or node.channel is not channel:
            return False
        del self.nodes[node_id]
        self.away_since[node_id] = self._clock()
        kept = []
        for replica in self.replicas.values():
            if replica.node_id != node_id:
                continue
            if replica.state is ReplicaPhase.READY and self.node_grace_s > 0:
                replica.state = (
                    ReplicaPhase.ABSENT
                )  # still in the router: requests go on while the agent restarts
                kept.append(replica.replica_id)
            else:
                self._set_state(replica, ReplicaPhase.ABSENT)
        self.changes.changed("nodes", "replicas")
        if kept:
            asyncio.get_running_loop().call_later(self.node_grace_s, self._drop_if_gone, node_id, kept)
        return True

    def away_for(self, node_id: str) -> float:
        """Seconds ``node_id`` has been without a session (0 while it has one)."""
        if node_id in self.nodes:
            return 0.0
        return self._clock() - self.away_since.setdefault(node_id, self._clock())

    def lost(self, node_id: str) -> bool:
        """Whether ``node_id`` has been away longer than the grace: its replicas belong elsewhere."""
        return node_id not in self.nodes and self.away_for(node_id) >= self.node_grace_s

    def next_loss_s(self) -> float | None:
        """Seconds until the next away node with replicas is lost; None when no node is due to be."""
        holding = {r.node_id for r in self.replicas.values()}
        due = [
            self.node_grace_s - self.away_for(node_id)
            for node_id in list(self.away_since)
            if node_id in holding and not self.lost(node_id)
        ]
        return min(due, default=None)

    def restart_grace(self) -> None:
        """Give every away node its whole grace from now: this control plane starts leading, and
        agents that followed another leader meanwhile have yet to reconnect."""
        now = self._clock()
        for node_id in self.away_since:
            self.away_since[node_id] = now

    def moved_away(self, replica: ReplicaState) -> None:
        """``replica`` was placed again elsewhere: forget it, and remember its node runs a stray."""
        self.moved[replica.replica_id] = replica.node_id
        self.forget(replica.replica_id)

    def stray(self, node_id: str, replica_id: str) -> bool:
        """Whether ``node_id`` runs ``replica_id`` although it was moved away; forgets it once told."""
        if self.moved.get(replica_id) != node_id:
            return False
        del self.moved[replica_id]
        return True

    def returned(self, node_id: str) -> None:
        """``node_id`` registered and its strays were stopped: forget what was moved off it."""
        for replica_id in [r for r, node in self.moved.items() if node == node_id]:
            del self.moved[replica_id]

    def _drop_if_gone(self, node_id: str, replica_ids: list[str]) -> None:
        """Take a gone node's replicas out of the router unless the node came back and reported them."""
        for replica_id in replica_ids:
            replica = self.replicas.get(replica_id)
            if replica is not None and replica.state is ReplicaPhase.ABSENT:
                log.info("node %s is still gone: %s leaves the router", node_id, replica_id)
                self._on_gone(replica_id)

    def apply_telemetry(self, node_id: str, telemetry: Telemetry) -> bool:
        """Take each card's free memory from what processes other than llmgw's engines hold there.

        This replaces the registration's verdict, so a card comes back into
        placement when a foreign process lets go. True when a card changed.
        """
        node = self.nodes.get(node_id)
        if node is None or not telemetry.samples:
            return False
        foreign: dict[int, int] = {}
        names: dict[int, tuple[str, ...]] = {}
        for process in telemetry.foreign:
            foreign[process.device] = foreign.get(process.device, 0) + int(process.used_mb)
            names[process.device] = (*names.get(process.device, ()), process.name or f"pid {process.pid}")
        node.foreign = names
        devices = []
        changed = False
        for device in node.inventory.devices:
            if device.kind == "nvidia":
                free = max(0, device.memory_mb - foreign.get(device.index, 0))
                if free != device.memory_free_mb:
                    device = dataclasses.replace(device, memory_free_mb=free)
                    changed = True
            devices.append(device)
        if changed:
            node.inventory = dataclasses.replace(node.inventory, devices=tuple(devices))
        return changed

    def check_fetch(self, node_id: str, sha256: str) -> None:
        """Unauthorized unless ``sha256`` is a file of a shard placed on ``node_id`` (FetchBlob).

        A node's certificate fetches only what its own replicas run, never
        another model's weights or adapters from the mirror.
        """
        if any(r.node_id == node_id and sha256 in r.blobs for r in self.replicas.values()):
            return
        if sha256 in self.release_blobs.get(node_id, frozenset()):
            return
        raise Unauthorized(
            f"node {node_id} runs no replica with the file {sha256[:12]}…, so it may not fetch it",
            "a node fetches only the weights, files and adapters of the replicas placed on it "
            "('llmgw ctl replicas' shows where each one runs)",
        )

    # replicas --------------------------------------------------------------
    def track(self, replica: ReplicaState) -> None:
        self.replicas[replica.replica_id] = replica
        self._by_model.setdefault(replica.model, {})[replica.replica_id] = replica
        self.changes.changed("replicas")
        if replica.node_id not in self.nodes:
            self.away_since.setdefault(replica.node_id, self._clock())  # a new leader's grace starts now

    def forget(self, replica_id: str) -> ReplicaState | None:
        replica = self.replicas.pop(replica_id, None)
        if replica is not None:
            of_model = self._by_model.get(replica.model, {})
            of_model.pop(replica_id, None)
            if not of_model:
                self._by_model.pop(replica.model, None)
            self._on_gone(replica_id)
            self.changes.changed("replicas")
        return replica

    def observe(
        self,
        node_id: str,
        replica_id: str,
        state: ShardState,
        port: int,
        error: str,
        compute: Compute,
        restarts: int = 0,
        adapter_paths: dict[str, str] | None = None,
        fetching: FetchProgress | None = None,
    ) -> ReplicaState | None:
        """Apply a shard's reported state; None when the replica is not one the leader knows."""
        replica = self.replicas.get(replica_id)
        if replica is None or replica.node_id != node_id:
            return None
        phase = ReplicaPhase.of_shard(state)
        if port:
            replica.port = port
        if compute.backend:
            replica.compute = compute.describe()
        replica.error = error
        replica.restarts = max(replica.restarts, restarts)
        if adapter_paths:
            replica.adapter_paths = dict(adapter_paths)
        if replica.adapters is None and phase is ReplicaPhase.READY:
            replica.adapters = tuple(replica.adapter_paths)
        replica.fetching = fetching if phase is ReplicaPhase.STARTING else None
        if phase is ReplicaPhase.READY:
            replica.backoff.reset()
        self._set_state(replica, phase)
        return replica

    def _set_state(self, replica: ReplicaState, state: ReplicaPhase) -> None:
        replica.state = state
        self.changes.changed("replicas")
        node = self.nodes.get(replica.node_id)
        if replica.draining_since is not None and state is ReplicaPhase.READY:
            return  # draining: it takes no new request, ready or not
        if state is ReplicaPhase.READY and node is not None and replica.port and replica.rank == 0:
            self._on_ready(replica, f"http://{node.inventory.address}:{replica.port}")
        else:
            self._on_gone(replica.replica_id)

    def of_model(self, model: str) -> list[ReplicaState]:
        return list(self._by_model.get(model, {}).values())
