"""Everything that goes up and down an agent's stream, as core types.

The protocol package encodes these to the wire and decodes them back
(:mod:`llmgw.protocol.messages`); the agent and the control plane see only these.
"""

from __future__ import annotations

from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.mirrorbuilds import MirrorBuilds
from llmgw.core.nodes import Heartbeat, NodeRegistration, Registered, RestartAgent, SettingsUpdate
from llmgw.core.shardlogs import LogLines, LogRequest
from llmgw.core.shards import ShardSpec, ShardStatus, StopShard
from llmgw.core.telemetry import Telemetry
from llmgw.core.trainingstream import (
    CancelTraining,
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingPiece,
    TrainingStatus,
)
from llmgw.core.upgrades import UpgradeAgent, UpgradeResult

AgentMessage = (
    NodeRegistration
    | ShardStatus
    | Heartbeat
    | Telemetry
    | LogLines
    | KvBlocksUpdate
    | UpgradeResult
    | TrainingStatus
    | TrainingPiece
)
"""What an agent sends: its registration first, then reports."""

ControlMessage = (
    Registered
    | ShardSpec
    | StopShard
    | SettingsUpdate
    | RestartAgent
    | Heartbeat
    | LogRequest
    | UpgradeAgent
    | MirrorBuilds
    | StartTraining
    | CancelTraining
    | TrainingFetch
    | TrainingCollected
)
"""What the control plane sends: the registration's answer, then commands (a ShardSpec starts a shard)."""

__all__ = ["AgentMessage", "ControlMessage"]
