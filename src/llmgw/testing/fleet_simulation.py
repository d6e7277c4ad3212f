"""A simulated fleet: many nodes whose agents speak the real protocol but start no engine.

Each :class:`SimulatedNode` is the agent's own :class:`~llmgw.agent.session.AgentSession`
(registration, standby and leader handling, reconnection with backoff, the
agent link's message conversion) over a real channel: in memory
(:class:`InProcessControlPlane`, the control plane's own sessions, fleet and
reconciler in this process) or gRPC with the node's own certificate
(:func:`grpc_connect`). In place of the agent's supervisor, :class:`SimulatedShards`
answers every ``StartShard`` with ``READY`` at once and every ``StopShard`` with
``STOPPED``. Each node sends a heartbeat every ``heartbeat_s``.

``python -m llmgw.testing.fleet_simulation`` runs a slice of such nodes over gRPC
(the control-plane benchmark starts a few of these processes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from llmgw.agent.session import AgentSession, Connect
from llmgw.agent.supervising import ShardSupervisor
from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.backoff import Backoff
from llmgw.core.devices import Device, NodeInventory
from llmgw.core.nodes import Heartbeat
from llmgw.core.shards import RunningShard, ShardSpec, ShardState, ShardStatus
from llmgw.protocol.channels import AgentChannel, memory_pair
from llmgw.protocol.grpc_client import KeptChannels
from llmgw.protocol.grpc_transport import TlsFiles
from llmgw.runtime import collector
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases

GPU_MB = 81920
"""Each simulated card's memory (an 80 GB card)."""


def simulated_inventory(node_id: str, gpus: int = 8, gpu_mb: int = GPU_MB) -> NodeInventory:
    """A node with ``gpus`` identical NVIDIA cards, 64 cores and 1 TiB of host memory."""
    cards = tuple(
        Device("nvidia", i, "NVIDIA H100 80GB HBM3", gpu_mb, gpu_mb, uuid=f"GPU-{node_id}-{i}")
        for i in range(gpus)
    )
    return NodeInventory(node_id, "127.0.0.1", cpu_cores=64, memory_mb=1 << 20, devices=cards)


@dataclass
class _Shard:
    replica_id: str
    model: str
    state: ShardState
    port: int

    def status(self) -> ShardStatus:
        return ShardStatus(replica_id=self.replica_id, state=self.state, port=self.port)

    def running(self) -> RunningShard:
        return RunningShard(replica_id=self.replica_id, model=self.model, state=self.state, port=self.port)


class SimulatedShards:
    """The agent supervisor's part the session uses, with engines that are ready at once."""

    def __init__(self) -> None:
        self.shards: dict[str, _Shard] = {}
        self.report: Callable[[ShardStatus], None] = lambda status: None
        self._next_port = 20000

    def snapshot(self) -> list[RunningShard]:
        return [shard.running() for shard in self.shards.values()]

    def log_of(self, replica_id: str) -> None:
        return None

    def start(self, spec: ShardSpec) -> None:
        shard = self.shards.get(spec.replica_id)
        if shard is None:
            self._next_port += 1
            shard = self.shards[spec.replica_id] = _Shard(
                spec.replica_id, spec.model, ShardState.READY, self._next_port
            )
        self.report(shard.status())

    async def stop(self, replica_id: str, reason: str = "") -> None:
        shard = self.shards.pop(replica_id, None)
        if shard is not None:
            self.report(dataclasses.replace(shard, state=ShardState.STOPPED).status())


class SimulatedNode:
    """One node: the agent's session over ``connect``, shards that are ready at once, heartbeats."""

    def __init__(
        self,
        node_id: str,
        control_planes: list[str],
        connect: Connect,
        gpus: int = 8,
        heartbeat_s: float = 10.0,
    ) -> None:
        self.node_id = node_id
        self.session_errors: list[str] = []
        """Each error that ended the session (the agent's supervisor would log it and run it again)."""
        self.shards = SimulatedShards()
        self.heartbeat_s = heartbeat_s
        self.session = AgentSession(
            simulated_inventory(node_id, gpus),
            cast(ShardSupervisor, self.shards),
            control_planes,
            connect,
            backoff=Backoff(base=0.5, factor=2.0, cap=5.0),
        )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            self.session_task = tasks.create_task(self._session())
            tasks.create_task(self._heartbeats())

    async def _session(self) -> None:
        """The session, run again after an error as the agent's process supervisor does (0.5 s on)."""
        while True:
            try:
                await self.session.run()
            except Exception as error:  # told, and run again, as the supervisor does
                self.session_errors.append(f"{type(error).__name__}: {error}")
                print(
                    f"{self.node_id}: the session failed ({self.session_errors[-1]}); again in 0.5 s",
                    flush=True,
                )
                await asyncio.sleep(0.5)

    def where(self) -> str:
        """Where this node's session waits now (its coroutines' stack), for a node that never registers."""
        task = getattr(self, "session_task", None)
        if task is None:
            return "not started"
        lines = []
        awaited: Any = task.get_coro()
        while awaited is not None:  # the chain of awaits, down to what the session waits on
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                lines.append(f"  {awaited!r}")
                break
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        return "\n".join(lines)

    async def _heartbeats(self) -> None:
        await asyncio.sleep(random.uniform(0, self.heartbeat_s))  # a fleet's nodes do not beat in step
        while True:
            await asyncio.sleep(self.heartbeat_s)
            self.session.send(Heartbeat(sent_unix_ms=int(time.time() * 1000)))


@dataclass
class SimulatedFleet:
    """``count`` nodes named ``<prefix>-<n>`` (from ``first``), each connecting by ``connect_of(node_id)``."""

    count: int
    control_planes: list[str]
    connect_of: Callable[[str], Connect]
    prefix: str = "sim"
    first: int = 0
    gpus: int = 8
    heartbeat_s: float = 10.0
    nodes: list[SimulatedNode] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for n in range(self.first, self.first + self.count):
            node_id = f"{self.prefix}-{n:04d}"
            self.nodes.append(
                SimulatedNode(
                    node_id, self.control_planes, self.connect_of(node_id), self.gpus, self.heartbeat_s
                )
            )

    def start(self) -> None:
        self._tasks = [asyncio.create_task(node.run()) for node in self.nodes]

    def registered(self) -> int:
        """Nodes whose session a leader accepted and which are connected now."""
        return sum(1 for node in self.nodes if node.session.connected.is_set())

    def ready_shards(self) -> int:
        return sum(len(node.shards.shards) for node in self.nodes)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []


def grpc_connect(node_dir: Callable[[str], Path]) -> Callable[[str], Connect]:
    """Connections over gRPC with mutual TLS, each node with the ``node.crt``/``node.key``/``ca.crt``
    in ``node_dir(node_id)`` (as ``llmgw server node-cert`` writes them)."""

    def connect_of(node_id: str) -> Connect:
        directory = node_dir(node_id)
        kept = KeptChannels(TlsFiles(directory / "ca.crt", directory / "node.crt", directory / "node.key"))

        async def connect(target: str) -> AgentChannel:
            return await kept.connect(target, timeout_s=5.0)

        return connect

    return connect_of


class InProcessControlPlane:
    """The leader's store, fleet, reconciler and node sessions in this process, nodes joined in memory.

    The reconciler is not run as a loop: call :meth:`Reconciler.pass_once` to time one pass.
    ``on_ready``/``on_gone`` are the fleet's hooks (the gateway's replica table follows them).
    """

    ADDRESS = "127.0.0.1:8443"

    def __init__(
        self,
        store: Store,
        leadership: Leadership,
        on_ready: Callable[[ReplicaState, str], None] = lambda replica, url: None,
        on_gone: Callable[[str], None] = lambda replica_id: None,
    ) -> None:
        self.store = store
        self.fleet = Fleet(on_ready=on_ready, on_gone=on_gone)
        self.reconciler = Reconciler(store, self.fleet)
        self.sessions = NodeSessions(store, self.fleet, self.reconciler, leadership)
        self._serving: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(
        cls,
        store_url: str,
        on_ready: Callable[[ReplicaState, str], None] = lambda replica, url: None,
        on_gone: Callable[[str], None] = lambda replica_id: None,
        *,
        freeze_gc: bool = False,
    ) -> InProcessControlPlane:
        """A leading control plane named ``cp1`` on the store at ``store_url``; with ``freeze_gc``, what this
        process holds by then is frozen out of the collector and its thresholds raised, as a control plane
        process does once built (``controlplane/running.py``, :mod:`llmgw.runtime.collector`)."""
        store = await Store.open(store_url)
        leadership = Leadership(
            Leases(store), Fence("cp1"), Identity("cp1", cls.ADDRESS, "http://127.0.0.1:8080")
        )
        await leadership.round()
        plane = cls(store, leadership, on_ready, on_gone)
        if freeze_gc:
            collector.settle()
        return plane

    def connect_of(self, node_id: str) -> Connect:
        """Join ``node_id`` to this control plane's sessions in memory (its name as its certificate's)."""

        async def connect(target: str) -> AgentChannel:
            agent, control = memory_pair(agent_name=node_id)
            task = asyncio.create_task(self.sessions.serve(control))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
            return agent

        return connect

    async def close(self) -> None:
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        await self.store.close()


async def run_slice(args: argparse.Namespace) -> None:
    """Run nodes ``first`` on over gRPC until cancelled, printing how many are registered."""
    nodes_dir = Path(args.nodes_dir)
    fleet = SimulatedFleet(
        args.count,
        args.control_plane,
        grpc_connect(lambda node_id: nodes_dir / node_id),
        prefix=args.prefix,
        first=args.first,
        gpus=args.gpus,
        heartbeat_s=args.heartbeat_s,
    )
    fleet.start()
    try:
        last = -1
        while True:
            now = fleet.registered()
            if now != last:
                print(f"registered {now}", flush=True)
                last = now
            await asyncio.sleep(0.5)
    finally:
        for node in fleet.nodes:  # a node left unregistered says where its session waits
            if not node.session.connected.is_set():
                print(f"{node.node_id} is not registered; its session:\n{node.where()}", flush=True)
        await fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Run simulated nodes over gRPC until interrupted.")
    parser.add_argument(
        "--nodes-dir", required=True, help="a folder per node with ca.crt, node.crt, node.key"
    )
    parser.add_argument("--control-plane", action="append", required=True, help="host:port of an agent port")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--heartbeat-s", type=float, default=10.0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_slice(args))


if __name__ == "__main__":
    main()
