"""The stream's envelopes: core messages to and from ``AgentMessage`` and ``ControlMessage``.

Each side of the stream encodes what it sends and decodes what it receives
here, through the codecs of each concern (:mod:`~llmgw.protocol.shards`,
:mod:`~llmgw.protocol.nodes`, :mod:`~llmgw.protocol.telemetry`). A message
whose kind this side does not know (a newer peer's) decodes to None.
"""

from __future__ import annotations

from llmgw.core.agentstream import AgentMessage, ControlMessage
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.mirrorbuilds import BuildAsset, MirrorBuilds, MirroredBuild
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
from llmgw.core.upgrades import ReleaseFile, UpgradeAgent, UpgradeResult
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.nodes import (
    decode_registered,
    decode_registration,
    encode_registered,
    encode_registration,
)
from llmgw.protocol.shards import (
    decode_shard_spec,
    decode_shard_status,
    decode_stop,
    encode_shard_spec,
    encode_shard_status,
    encode_stop,
)
from llmgw.protocol.telemetry import decode_telemetry, encode_telemetry
from llmgw.protocol.training import (
    decode_cancel,
    decode_collected,
    decode_fetch,
    decode_piece,
    decode_start,
    decode_status,
    encode_cancel,
    encode_collected,
    encode_fetch,
    encode_piece,
    encode_start,
    encode_status,
)


def encode_kv_blocks(update: KvBlocksUpdate) -> pb.KvBlocks:
    """The wire carries no model: the control plane knows each replica's."""
    return pb.KvBlocks(
        replica_id=update.replica_id,
        reset=update.reset,
        stored=list(update.stored),
        removed=list(update.removed),
        hash_seed=update.hash_seed,
        block_size=update.block_size,
        mismatch=update.mismatch,
    )


def decode_kv_blocks(message: pb.KvBlocks, model: str = "") -> KvBlocksUpdate:
    return KvBlocksUpdate(
        model=model,
        replica_id=message.replica_id,
        stored=tuple(message.stored),
        removed=tuple(message.removed),
        reset=message.reset,
        hash_seed=message.hash_seed,
        block_size=message.block_size,
        mismatch=message.mismatch,
    )


def encode_upgrade(message: UpgradeAgent) -> pb.UpgradeAgent:
    return pb.UpgradeAgent(
        version=message.version,
        sums=message.sums,
        signature=message.signature,
        files=[pb.WeightsFile(sha256=f.sha256, filename=f.filename, size=f.size) for f in message.files],
    )


def decode_upgrade(message: pb.UpgradeAgent) -> UpgradeAgent:
    return UpgradeAgent(
        version=message.version,
        sums=message.sums,
        signature=message.signature,
        files=tuple(ReleaseFile(sha256=f.sha256, filename=f.filename, size=f.size) for f in message.files),
    )


def encode_builds(message: MirrorBuilds) -> pb.MirrorBuilds:
    return pb.MirrorBuilds(
        builds=[
            pb.MirroredBuild(
                engine=b.engine,
                version=b.version,
                variant=b.variant,
                arch=b.arch,
                assets=[pb.WeightsFile(sha256=a.sha256, filename=a.name, size=a.size) for a in b.assets],
            )
            for b in message.builds
        ]
    )


def decode_builds(message: pb.MirrorBuilds) -> MirrorBuilds:
    return MirrorBuilds(
        tuple(
            MirroredBuild(
                engine=b.engine,
                version=b.version,
                variant=b.variant,
                arch=b.arch,
                assets=tuple(BuildAsset(a.filename, a.sha256, a.size) for a in b.assets),
            )
            for b in message.builds
        )
    )


def encode_agent_message(message: AgentMessage) -> pb.AgentMessage:
    match message:
        case NodeRegistration():
            return pb.AgentMessage(register=encode_registration(message))
        case ShardStatus():
            return pb.AgentMessage(status=encode_shard_status(message))
        case Heartbeat():
            return pb.AgentMessage(heartbeat=pb.Heartbeat(sent_unix_ms=message.sent_unix_ms))
        case Telemetry():
            return pb.AgentMessage(telemetry=encode_telemetry(message))
        case LogLines():
            return pb.AgentMessage(
                logs=pb.LogLines(
                    request_id=message.request_id,
                    lines=list(message.lines),
                    end=message.end,
                    error=message.error,
                )
            )
        case KvBlocksUpdate():
            return pb.AgentMessage(kv_blocks=encode_kv_blocks(message))
        case UpgradeResult():
            return pb.AgentMessage(
                upgrade_result=pb.UpgradeResult(version=message.version, error=message.error)
            )
        case TrainingStatus():
            return pb.AgentMessage(training=encode_status(message))
        case TrainingPiece():
            return pb.AgentMessage(training_piece=encode_piece(message))


def decode_agent_message(message: pb.AgentMessage) -> AgentMessage | None:
    kind = message.WhichOneof("kind")
    if kind == "register":
        return decode_registration(message.register)
    if kind == "status":
        return decode_shard_status(message.status)
    if kind == "heartbeat":
        return Heartbeat(sent_unix_ms=message.heartbeat.sent_unix_ms)
    if kind == "telemetry":
        return decode_telemetry(message.telemetry)
    if kind == "logs":
        logs = message.logs
        return LogLines(request_id=logs.request_id, lines=tuple(logs.lines), end=logs.end, error=logs.error)
    if kind == "kv_blocks":
        return decode_kv_blocks(message.kv_blocks)
    if kind == "upgrade_result":
        return UpgradeResult(version=message.upgrade_result.version, error=message.upgrade_result.error)
    if kind == "training":
        return decode_status(message.training)
    if kind == "training_piece":
        return decode_piece(message.training_piece)
    return None


def encode_control_message(message: ControlMessage) -> pb.ControlMessage:
    match message:
        case Registered():
            return pb.ControlMessage(registered=encode_registered(message))
        case ShardSpec():
            return pb.ControlMessage(start=encode_shard_spec(message))
        case StopShard():
            return pb.ControlMessage(stop=encode_stop(message))
        case SettingsUpdate():
            return pb.ControlMessage(settings=pb.Settings(yaml=message.yaml))
        case RestartAgent():
            return pb.ControlMessage(restart=pb.RestartAgent(reason=message.reason))
        case Heartbeat():
            return pb.ControlMessage(heartbeat=pb.Heartbeat(sent_unix_ms=message.sent_unix_ms))
        case UpgradeAgent():
            return pb.ControlMessage(upgrade=encode_upgrade(message))
        case MirrorBuilds():
            return pb.ControlMessage(builds=encode_builds(message))
        case StartTraining():
            return pb.ControlMessage(start_training=encode_start(message))
        case CancelTraining():
            return pb.ControlMessage(cancel_training=encode_cancel(message))
        case TrainingFetch():
            return pb.ControlMessage(training_fetch=encode_fetch(message))
        case TrainingCollected():
            return pb.ControlMessage(training_collected=encode_collected(message))
        case LogRequest():
            return pb.ControlMessage(
                logs=pb.LogRequest(
                    request_id=message.request_id,
                    replica_id=message.replica_id,
                    lines=message.lines,
                    follow=message.follow,
                    cancel=message.cancel,
                )
            )


def decode_control_message(message: pb.ControlMessage) -> ControlMessage | None:
    kind = message.WhichOneof("kind")
    if kind == "registered":
        return decode_registered(message.registered)
    if kind == "start":
        return decode_shard_spec(message.start)
    if kind == "stop":
        return decode_stop(message.stop)
    if kind == "settings":
        return SettingsUpdate(yaml=message.settings.yaml)
    if kind == "restart":
        return RestartAgent(reason=message.restart.reason)
    if kind == "heartbeat":
        return Heartbeat(sent_unix_ms=message.heartbeat.sent_unix_ms)
    if kind == "upgrade":
        return decode_upgrade(message.upgrade)
    if kind == "builds":
        return decode_builds(message.builds)
    if kind == "start_training":
        return decode_start(message.start_training)
    if kind == "cancel_training":
        return decode_cancel(message.cancel_training)
    if kind == "training_fetch":
        return decode_fetch(message.training_fetch)
    if kind == "training_collected":
        return decode_collected(message.training_collected)
    if kind == "logs":
        logs = message.logs
        return LogRequest(
            request_id=logs.request_id,
            replica_id=logs.replica_id,
            lines=logs.lines,
            follow=logs.follow,
            cancel=logs.cancel,
        )
    return None
