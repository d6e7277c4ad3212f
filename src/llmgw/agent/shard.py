"""One shard as the agent supervises it: its spec, its engine process, ports, state and output.

:class:`Shard` is what :class:`~llmgw.agent.supervising.ShardSupervisor` keeps per
replica and what a shard's state file (:mod:`llmgw.agent.shardstates`) and
its reports to the control plane are made from.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent.engineoutput import OutputFollower, ShardLog
from llmgw.agent.launching import EngineProcess
from llmgw.agent.shardstates import ShardRecord
from llmgw.core.shards import Compute, FetchProgress, RunningShard, ShardSpec, ShardState, ShardStatus
from llmgw.errors import LlmgwError


@dataclass
class Shard:
    spec: ShardSpec
    directory: Path
    state: ShardState = ShardState.STARTING
    port: int = 0
    error: str = ""
    restarts: int = 0
    compute: Compute = field(default_factory=Compute)
    process: EngineProcess | None = None
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    command: list[str] = field(default_factory=list)
    """The engine's argv; an adopted shard keeps the one its state file had."""
    start_time: str = ""
    output: str = ""
    """The current process's output file, in the shard's directory."""
    log: ShardLog = field(default_factory=ShardLog)
    follower: asyncio.Task[None] | None = None
    taking: asyncio.Task[None] | None = None
    """Fetching the adapters its model gained while it runs (an engine that loads them at run time)."""
    reader: OutputFollower | None = None
    """What ``follower`` runs: read once more before READY, so no key printed at start is left."""
    kv_events_port: int | None = None
    """Where the engine publishes its KV events (vLLM with kv_events), while it runs."""
    adapter_paths: dict[str, str] = field(default_factory=dict)
    """Each LoRA adapter's folder or file on this node, by name, once fetched."""
    kv_replay_port: int | None = None
    """Where the engine answers KV-event replay requests, beside ``kv_events_port``."""
    killed: str = ""
    """Why the agent killed the current engine (it stopped answering), for the restart's reason."""
    fetching: FetchProgress | None = None
    """How far its files have come from the mirror, while they come."""

    @property
    def ports(self) -> set[int]:
        """Every port the shard's engine holds (its HTTP port, its KV-events ports)."""
        return {p for p in (self.port, self.kv_events_port, self.kv_replay_port) if p}

    @property
    def replica_id(self) -> str:
        return self.spec.replica_id

    @property
    def log_path(self) -> Path:
        return self.directory / (self.output or "output.log")

    def record(self) -> ShardRecord:
        return ShardRecord(
            spec=self.spec,
            command=self.command,
            pid=self.process.pid if self.process is not None else 0,
            start_time=self.start_time,
            port=self.port,
            compute=self.compute,
            restarts=self.restarts,
            output=self.output,
            adapter_paths=self.adapter_paths,
        )

    def status(self) -> ShardStatus:
        return ShardStatus(
            replica_id=self.replica_id,
            state=self.state,
            port=self.port,
            compute=self.compute,
            error=self.error,
            restarts=self.restarts,
            adapter_paths=dict(self.adapter_paths),
            fetching=self.fetching,
        )

    def running(self) -> RunningShard:
        return RunningShard(
            replica_id=self.replica_id,
            model=self.spec.model,
            state=self.state,
            port=self.port,
            compute=self.compute,
            error=self.error,
            adapter_paths=dict(self.adapter_paths),
        )


def free_port(first: int, last: int, taken: set[int], host: str = "127.0.0.1") -> int:
    """A port in [first, last] nobody listens on and no shard of ours holds."""
    for port in range(first, last + 1):
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise LlmgwError(f"no free port in {first}-{last}", "widen ports.first/ports.last in agent.yaml")
