"""What the training tests share: a control plane's training side on a store, and a model to train."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.training.scheduling import TrainingScheduler
from llmgw.core.tenancy import CLUSTER, Owner
from llmgw.core.training import pairs_bytes
from llmgw.mirror.blobs import BlobStore
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.store.training import JobRecord
from llmgw.testing.clock import FakeClock
from llmgw.testing.trainingagent import TrainingAgentStandin

CONFIG = json.dumps({"model_type": "llama", "hidden_size": 64, "_name_or_path": "tiny-llama"}).encode()
WEIGHTS = b"safetensors weights"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def mirror(store: Store, blobs: BlobStore, data: bytes, filename: str) -> dict[str, Any]:
    async def chunks() -> Any:
        yield data

    info = await blobs.import_stream(chunks(), filename)
    await store.blobs.add(info.sha256, info.size, filename, "weights")
    return {"sha256": info.sha256, "filename": filename, "size": info.size}


async def add_model(store: Store, blobs: BlobStore, engine: str = "vllm", name: str = "tiny-llama") -> None:
    """A safetensors model with its config in the catalog and the mirror."""
    weights = await mirror(store, blobs, WEIGHTS, "model.safetensors")
    config = await mirror(store, blobs, CONFIG, "config.json")
    definition = {
        "name": name,
        "source": {"format": "safetensors", **weights, "files": [config]},
        "profiles": [{"engine": engine}],
    }
    await store.models.add(name, definition)


async def add_job(
    store: Store, *, node: str = "any", device_kind: str = "cpu", retry: int = 0, owner: Owner = CLUSTER
) -> JobRecord:
    spec = {
        "device_kind": device_kind,
        "weights": [{"sha256": sha(WEIGHTS), "filename": "model.safetensors", "size": len(WEIGHTS)}],
        "options": {"rank": 8, "steps": 3},
        "gguf": False,
        "collections": [],
    }
    return await store.training.add(
        owner=owner,
        model="tiny-llama",
        node=node,
        memory_mb=1024,
        retry=retry,
        spec=spec,
        pairs=pairs_bytes([("colour?", "blue")]),
    )


@dataclass
class Plane:
    """One control plane's training side: sessions, fleet and scheduler on ``store``."""

    store: Store
    blobs: BlobStore
    clock: FakeClock
    name: str = "cp1"
    fleet: Fleet = field(init=False)
    sessions: NodeSessions = field(init=False)
    scheduler: TrainingScheduler = field(init=False)
    leadership: Leadership = field(init=False)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
        self.leadership = Leadership(
            Leases(self.store),
            Fence(self.name),
            Identity(self.name, "127.0.0.1:8443", "http://127.0.0.1:8080"),
        )
        self.sessions = NodeSessions(
            self.store, self.fleet, Reconciler(self.store, self.fleet), self.leadership
        )
        self.scheduler = TrainingScheduler(
            self.store,
            self.fleet,
            self.blobs,
            interval_s=0.02,
            grace_s=30.0,
            progress_every_s=0.0,
            piece_timeout_s=2.0,
            clock=self.clock.monotonic,
        )
        self.sessions.on_training = self.scheduler.receive

    def start(self) -> None:
        self.tasks.append(asyncio.create_task(self.scheduler.run()))

    def connect(self, agent: TrainingAgentStandin) -> tuple[Any, asyncio.Task[None]]:
        """Join ``agent`` to this plane over a new stream; (the agent's side, the agent's task)."""
        agent_side, control_side = memory_pair(agent_name=agent.node_id)
        self.tasks.append(asyncio.create_task(self.sessions.serve(control_side)))
        task = asyncio.create_task(agent.serve(agent_side))
        self.tasks.append(task)
        return agent_side, task

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


async def open_plane(path: Path, name: str = "cp1", clock: FakeClock | None = None) -> Plane:
    store = await Store.open(f"sqlite+aiosqlite:///{path / 'llmgw.db'}")
    plane = Plane(store, BlobStore(path / name / "mirror"), clock or FakeClock(), name)
    await plane.leadership.round()
    return plane
