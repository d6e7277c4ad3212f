"""Shards and replicas: what a node is asked to run, and the states each goes through.

A *shard* is one engine process on a node, started from a :class:`ShardSpec`
and reported as a :class:`ShardStatus`. A *replica* is the control plane's
view of one placed copy of a model; its :class:`ReplicaPhase` follows the
states its node reports, plus the phases only the control plane knows
(placed, absent).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.core.mig import device_label


class ShardState(enum.StrEnum):
    """Where a shard stands on its node."""

    UNKNOWN = "unknown"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def ended(self) -> bool:
        """True when the shard's engine no longer runs and will not by itself."""
        return self in (ShardState.FAILED, ShardState.STOPPED)


class ReplicaPhase(enum.StrEnum):
    """Where a replica stands as the leader sees it: placed → starting → ready; failed; absent."""

    PLACED = "placed"
    """In the store, not yet asked of its node."""
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    ABSENT = "absent"
    """Its node has not reported it (the node is gone, or has not registered since)."""
    STOPPED = "stopped"
    UNKNOWN = "unknown"

    @classmethod
    def of_shard(cls, state: ShardState) -> ReplicaPhase:
        """The phase a shard's reported state puts its replica in."""
        return _OF_SHARD[state]

    @property
    def worth(self) -> int:
        """How much a replica in this phase is worth keeping: the least worth is removed first."""
        return _WORTH.get(self, 0)


_OF_SHARD = {
    ShardState.UNKNOWN: ReplicaPhase.UNKNOWN,
    ShardState.STARTING: ReplicaPhase.STARTING,
    ShardState.READY: ReplicaPhase.READY,
    ShardState.FAILED: ReplicaPhase.FAILED,
    ShardState.STOPPED: ReplicaPhase.STOPPED,
}
_WORTH = {
    ReplicaPhase.FAILED: 0,
    ReplicaPhase.ABSENT: 1,
    ReplicaPhase.PLACED: 2,
    ReplicaPhase.STARTING: 3,
    ReplicaPhase.READY: 4,
}


@dataclass(frozen=True)
class WeightsFile:
    """One file of a model or adapter in the mirror, by checksum."""

    sha256: str
    filename: str
    size: int = 0


@dataclass(frozen=True)
class AdapterSpec:
    """One LoRA adapter a shard fetches: its weights file and, for a PEFT folder, the folder's other files."""

    name: str
    sha256: str
    filename: str
    size: int = 0
    files: tuple[WeightsFile, ...] = ()
    scale: float | None = None
    """llama.cpp's --lora-scaled; None: 1.0."""


@dataclass(frozen=True)
class Rendezvous:
    """How the shards of one multi-node replica find each other (C5.5).

    Every shard of the replica is started at once; rank 0 (the head) runs the
    engine's server and the others join it at ``address`` (``HOST:PORT``, a port
    on the head's node that the reconciler chose from the replica's id).
    """

    rank: int
    nodes: int
    address: str

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


@dataclass(frozen=True)
class ShardSpec:
    """What a node needs to start one replica's engine."""

    replica_id: str
    model: str = ""
    engine: str = ""
    weights_sha256: str = ""
    weights_filename: str = ""
    weights_size: int = 0
    weights_format: str = ""
    """"gguf" or "safetensors"."""
    files: tuple[WeightsFile, ...] = ()
    """The rest of a safetensors repository, fetched beside the weights."""
    projector_sha256: str = ""
    """A GGUF vision model's projector, fetched beside the weights."""
    projector_filename: str = ""
    projector_size: int = 0
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    api_key: str = field(default="", repr=False)
    """The replica's own key; only the router and the agent know it (never in a repr, so never in a log)."""
    devices: tuple[int, ...] = ()
    ctx_size: int = 0
    parallel: int = 0
    tp: int = 0
    """Tensor-parallel degree (vLLM, SGLang, TensorRT-LLM); 0: one per device given."""
    pp: int = 0
    """Pipeline-parallel degree; 0 or 1: one stage. A shard on one node spans tp x pp cards."""
    kv_events: bool = False
    """The engine publishes its KV-cache events to the agent (vLLM)."""
    max_loaded_adapters: int = 0
    """vLLM's runtime LoRA slots (0: adapters are given to the engine at start)."""
    adapters: tuple[AdapterSpec, ...] = ()
    max_lora_rank: int = 0
    """vLLM's --max-lora-rank (0: the engine's default)."""
    traceparent: str = ""
    """W3C trace context of the replica's start on the control plane; empty when not traced."""
    serves: str = "chat"
    """What the engine is started for: ``chat``, ``embeddings`` or ``rerank`` (``core.engines.Task``)."""
    pooling: str = ""
    """llama.cpp's pooling for an embedding model; empty: the model's own."""
    comfyui_nodes: tuple[str, ...] = ()
    """ComfyUI: the replica's custom nodes, each ``{"repository", "commit", "packages"}`` as JSON."""
    comfyui_hf_repository: str = ""
    """ComfyUI: the Hugging Face repository (``ORG/NAME``) the model's fetched files are a snapshot of."""
    rendezvous: Rendezvous | None = None
    """A shard of a multi-node replica: its rank, the node count and the head's address."""

    @property
    def head(self) -> bool:
        """True for the shard that serves the replica's requests (rank 0, or the only one)."""
        return self.rendezvous is None or self.rendezvous.rank == 0


@dataclass(frozen=True)
class Compute:
    """Where a shard really computes."""

    backend: str = ""
    """"cpu", "cuda", "vulkan"; empty while unknown."""
    devices: tuple[int, ...] = ()
    layers_offloaded: int = 0
    memory_mb: int = 0

    def describe(self) -> str:
        """``cuda:0,1 4096 MiB``, ``cuda:1/mig0`` (a MIG instance), ``cpu``, or empty while unknown."""
        if not self.backend:
            return ""
        if self.backend == "cpu":
            return "cpu"
        devices = ",".join(device_label(d) for d in self.devices)
        where = f"{self.backend}:{devices}" if devices else self.backend
        return f"{where} {self.memory_mb} MiB" if self.memory_mb else where


@dataclass(frozen=True)
class FetchProgress:
    """How far a starting shard's node has fetched its files from the mirror."""

    done: int
    """Bytes of the shard's files on the node (fetched now, or found there and checked)."""
    total: int
    """Bytes of all the shard's files."""
    bytes_per_s: float = 0.0
    """The fetch's rate since the last report."""

    @property
    def percent(self) -> int:
        return 100 * self.done // self.total if self.total > 0 else 100

    def describe(self) -> str:
        """``fetching 41 % at 950 MB/s`` (MB: 10^6 bytes)."""
        return f"fetching {self.percent} % at {self.bytes_per_s / 1e6:.0f} MB/s"


@dataclass(frozen=True)
class ShardStatus:
    """A shard's state as its node reports it, on each change."""

    replica_id: str
    state: ShardState = ShardState.UNKNOWN
    port: int = 0
    compute: Compute = Compute()
    error: str = ""
    restarts: int = 0
    adapter_paths: Mapping[str, str] = field(default_factory=dict)
    """Each LoRA adapter's folder (vLLM) or file (llama.cpp) on the node, by name."""
    fetching: FetchProgress | None = None
    """While a STARTING shard's files come from the mirror: how far, how fast."""


@dataclass(frozen=True)
class RunningShard:
    """A shard a node runs, as its registration lists it."""

    replica_id: str
    model: str = ""
    state: ShardState = ShardState.UNKNOWN
    port: int = 0
    compute: Compute = Compute()
    error: str = ""
    adapter_paths: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StopShard:
    """Stop a replica's shard, saying why."""

    replica_id: str
    reason: str = ""
