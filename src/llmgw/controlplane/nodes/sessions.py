"""Serving one node's stream: registration, shard status, heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from llmgw.controlplane.lifecycle.leadership import Leadership
from llmgw.controlplane.nodes.agentsettings import SettingsPush
from llmgw.controlplane.nodes.fleet import Fleet, NodeState
from llmgw.controlplane.nodes.gpu_history import GpuHistory
from llmgw.controlplane.nodes.noderecording import NodeRecords
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.mirrorbuilds import MirrorBuilds
from llmgw.core.nodes import Heartbeat, NodeRegistration, Registered
from llmgw.core.shardlogs import LogLines
from llmgw.core.shards import ReplicaPhase, ShardStatus, StopShard
from llmgw.core.telemetry import Telemetry
from llmgw.core.trainingstream import TrainingPiece, TrainingStatus
from llmgw.core.upgrades import UpgradeResult
from llmgw.errors import ChannelClosed, LlmgwError
from llmgw.observability import logcontext
from llmgw.observability.gpu_metrics import GpuMetrics, process_gpu_metrics
from llmgw.protocol.channels import ControlChannel
from llmgw.protocol.links import ControlLink, control_link
from llmgw.store.database import Store

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 10.0


class NodeSessions:
    """Accepts agents' streams for the leader; a standby points them to the leader."""

    def __init__(
        self,
        store: Store,
        fleet: Fleet,
        reconciler: Reconciler,
        leadership: Leadership,
        settings: SettingsPush | None = None,
        gpu_metrics: GpuMetrics | None = None,
        on_kv_blocks: Callable[[KvBlocksUpdate], None] = lambda update: None,
        gpu_history: GpuHistory | None = None,
        records: NodeRecords | None = None,
        on_upgrade_result: Callable[[str, UpgradeResult], None] = lambda node_id, result: None,
        on_training: Callable[[str, TrainingStatus | TrainingPiece], None] = lambda node_id, message: None,
        mirror_builds: Callable[[], MirrorBuilds] = MirrorBuilds,
    ) -> None:
        self.records = records or NodeRecords(store)
        """Registrations written to the store in batches."""
        self._settings = settings
        self._store = store
        self._fleet = fleet
        self._reconciler = reconciler
        self._leadership = leadership
        self._gpu_metrics = gpu_metrics or process_gpu_metrics()
        self.gpu_history = gpu_history or GpuHistory()
        """Each card's recent readings, for the portal's charts (``/api/gpu-history``)."""
        self._serving: set[asyncio.Task[None]] = set()
        self._telling: set[asyncio.Task[None]] = set()
        self.on_kv_blocks = on_kv_blocks
        self.on_upgrade_result = on_upgrade_result
        """Given a node's answer that it did not upgrade (``ctl upgrade agents``)."""
        self.on_training = on_training
        """Given a node's training status or piece of a result
        (:mod:`llmgw.controlplane.training.scheduling`)."""
        self.mirror_builds = mirror_builds
        """The engine builds the mirror holds, told to each node as it registers."""
        """Given a node's KV-block changes for one of its own replicas, its model named (the router
        mirrors them)."""

    def _registered(self) -> Registered:
        leadership = self._leadership
        leader = leadership.leader
        return Registered(
            leader=leadership.holder,
            control_planes=tuple(p.agent_address for p in leadership.control_planes if p.agent_address),
            standby=not leadership.serving,
            leader_address=leader.agent_address if leader else "",
        )

    def tell_planes(self) -> None:
        """Tell every connected agent the control planes there are now (one joined or left)."""
        if not self._leadership.serving:
            return
        message = self._registered()
        for node_id, node in list(self._fleet.nodes.items()):
            task = asyncio.create_task(self._tell(node_id, node.channel, message))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    async def _tell(self, node_id: str, channel: ControlLink, message: Registered) -> None:
        try:
            await channel.send(message)
        except ChannelClosed:
            log.info("could not tell node %s the control planes: its stream ended", node_id)

    def let_go(self) -> int:
        """End every agent's stream now (this control plane stopped leading); how many there were."""
        count = 0
        for task in list(self._serving):
            task.cancel()
            count += 1
        return count

    async def serve(self, wire: ControlChannel) -> None:
        """Run one node's session until its stream ends (or this control plane stops leading)."""
        task = asyncio.current_task()
        assert task is not None
        channel = control_link(wire)
        if not self._leadership.serving:
            with contextlib.suppress(ChannelClosed, TimeoutError):
                await asyncio.wait_for(channel.receive(), REGISTER_TIMEOUT_S)
                await channel.send(self._registered())
            return
        self._serving.add(task)
        try:
            await self._serve(channel)
        except asyncio.CancelledError:
            if self._leadership.serving:
                raise
            log.info("let %s go: this control plane no longer leads", channel.peer)
        finally:
            self._serving.discard(task)

    async def _serve(self, channel: ControlLink) -> None:
        try:
            register = await asyncio.wait_for(channel.receive(), REGISTER_TIMEOUT_S)
        except (TimeoutError, ChannelClosed):
            log.warning("a stream from %s ended before it registered", channel.peer)
            return
        if not isinstance(register, NodeRegistration):
            log.warning(
                "%s sent %s before registering; closing its stream", channel.peer, type(register).__name__
            )
            return
        if register.node_id != channel.peer:
            log.warning(
                "refused a registration as node %r from a certificate issued to %r: "
                "issue the node its own certificate with 'llmgw server node-cert %s'",
                register.node_id,
                channel.peer,
                register.node_id,
            )
            await channel.close()
            return
        node_id = register.node_id
        logcontext.NODE.set(node_id)  # the session's log lines name its node
        replaced = self._fleet.attach(register, channel)
        if replaced is not None:
            await replaced.channel.close()
        node = self._fleet.nodes[node_id]
        log.info(
            "node %s registered from %s: %d cores, %d MiB, %d cards, %d shards",
            node_id,
            register.inventory.address,
            register.inventory.cpu_cores,
            register.inventory.memory_mb,
            len(node.inventory.gpus),
            len(register.shards),
        )
        try:
            # Answered before anything awaits: a reconcile pass running meanwhile (a new leader's, as a
            # thousand nodes register at once) must not send the node a StartShard ahead of this answer.
            await channel.send(self._registered())
            if self._settings is not None:
                await self._settings.send(node_id, channel)
            await self._send_builds(node_id, channel)
            await self._adopt(node_id, register, channel)
            self.records.record(node_id, register.inventory.address, _inventory_dict(node))
            self._reconciler.wake()
            while True:
                message = await channel.receive()
                node.last_heard = time.monotonic()
                match message:
                    case ShardStatus():
                        await self._on_status(node_id, message, channel)
                    case LogLines():
                        self._fleet.logs.deliver(message)
                    case Telemetry():
                        self._gpu_metrics.update(node_id, message)
                        self.gpu_history.add(node_id, message)
                        if self._fleet.apply_telemetry(node_id, message):
                            self._reconciler.wake()
                    case KvBlocksUpdate():
                        self._on_kv_blocks(node_id, message)
                    case Heartbeat():
                        await channel.send(Heartbeat(sent_unix_ms=int(time.time() * 1000)))
                    case UpgradeResult():
                        self.on_upgrade_result(node_id, message)
                    case TrainingStatus() | TrainingPiece():
                        self.on_training(node_id, message)
                    case NodeRegistration():
                        log.warning("node %s registered again on the same stream: ignored", node_id)
        except ChannelClosed as closed:
            log.info("node %s left: %s", node_id, closed.message)
        finally:
            if self._fleet.detach(node_id, channel):
                self._reconciler.wake()

    async def _send_builds(self, node_id: str, channel: ControlLink) -> None:
        try:
            builds = self.mirror_builds()
        except LlmgwError as error:
            log.error("not telling node %s the mirror's engine builds: %s", node_id, error)
            return
        if builds.builds:
            await channel.send(builds)

    async def _adopt(self, node_id: str, register: NodeRegistration, channel: ControlLink) -> None:
        """Take in the shards a node says it runs; stop the ones no replica wants."""
        reported = set()
        for shard in register.shards:
            replica = self._fleet.observe(
                node_id,
                shard.replica_id,
                shard.state,
                shard.port,
                shard.error,
                shard.compute,
                adapter_paths=dict(shard.adapter_paths),
            )
            if replica is None:
                reason = (
                    "moved to another node while this one was away"
                    if self._fleet.stray(node_id, shard.replica_id)
                    else "not in the catalog"
                )
                log.info("node %s runs %s (%s): stopping it", node_id, shard.replica_id, reason)
                await channel.send(StopShard(replica_id=shard.replica_id, reason=reason))
            else:
                reported.add(shard.replica_id)
        self._fleet.returned(node_id)
        for replica in self._fleet.replicas.values():
            if replica.node_id == node_id and replica.replica_id not in reported:
                replica.state = ReplicaPhase.ABSENT

    def _on_kv_blocks(self, node_id: str, update: KvBlocksUpdate) -> None:
        replica = self._fleet.replicas.get(update.replica_id)
        if replica is None or replica.node_id != node_id:
            return  # only a node's own replicas: never another node's blocks
        if update.block_size:
            replica.kv_block_size = update.block_size
        if update.mismatch != replica.kv_mismatch:
            if update.mismatch:
                log.warning("replica %s of %s: %s", replica.replica_id, replica.model, update.mismatch)
            replica.kv_mismatch = update.mismatch
        self.on_kv_blocks(dataclasses.replace(update, model=replica.model))

    async def _on_status(self, node_id: str, status: ShardStatus, channel: ControlLink) -> None:
        replica = self._fleet.observe(
            node_id,
            status.replica_id,
            status.state,
            status.port,
            status.error,
            status.compute,
            status.restarts,
            dict(status.adapter_paths),
            status.fetching,
        )
        if replica is None:
            if not status.state.ended:
                await channel.send(StopShard(replica_id=status.replica_id, reason="unknown replica"))
            return
        if status.fetching is not None:
            return  # a fetch's progress (twice a second): shown in the replica's state, not logged
        log.info(
            "replica %s of %s on %s: %s%s",
            replica.replica_id,
            replica.model,
            node_id,
            replica.state,
            f" ({replica.error})" if replica.error else "",
        )
        self._reconciler.observed(replica)  # a replica's start span ends when it serves
        if replica.state is ReplicaPhase.FAILED:
            self._reconciler.failed(replica)


def _inventory_dict(node: NodeState) -> dict[str, object]:
    inventory = node.inventory
    return {
        "cpu_cores": inventory.cpu_cores,
        "memory_mb": inventory.memory_mb,
        "driver_version": inventory.driver_version,
        "devices": [dataclasses.asdict(d) for d in inventory.devices],
        "engines": list(node.engines),
    }
