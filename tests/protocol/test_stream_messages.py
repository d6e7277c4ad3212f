"""Every kind of stream message crosses in its envelope unchanged; an unknown kind is skipped."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.agentstream import AgentMessage, ControlMessage
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.mirrorbuilds import BuildAsset, MirrorBuilds, MirroredBuild
from llmgw.core.nodes import Heartbeat, RestartAgent, SettingsUpdate
from llmgw.core.shardlogs import LogLines, LogRequest
from llmgw.core.shards import ShardState, ShardStatus, StopShard
from llmgw.core.telemetry import Telemetry
from llmgw.core.trainingstream import (
    CancelTraining,
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingFile,
    TrainingPiece,
    TrainingState,
    TrainingStatus,
)
from llmgw.core.upgrades import ReleaseFile, UpgradeAgent, UpgradeResult
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair
from llmgw.protocol.links import agent_link, control_link
from llmgw.protocol.messages import (
    decode_agent_message,
    decode_control_message,
    decode_kv_blocks,
    encode_agent_message,
    encode_control_message,
    encode_kv_blocks,
)

from .wire_strategies import (
    int64,
    kv_updates,
    registereds,
    registrations,
    shard_specs,
    shard_statuses,
    telemetries,
    text,
)

training_files = st.lists(st.builds(TrainingFile, sha256=text, filename=text, size=int64), max_size=2).map(
    tuple
)
int32 = st.integers(-(2**31), 2**31 - 1)

agent_messages = st.one_of(
    registrations,
    shard_statuses,
    telemetries,
    kv_updates,
    st.builds(Heartbeat, sent_unix_ms=int64),
    st.builds(
        LogLines, request_id=text, lines=st.lists(text, max_size=3).map(tuple), end=st.booleans(), error=text
    ),
    st.builds(UpgradeResult, version=text, error=text),
    st.builds(
        TrainingStatus,
        job_id=text,
        attempt=int32,
        state=st.sampled_from(TrainingState),
        step=int32,
        steps=int32,
        loss=st.floats(allow_nan=False),
        peak_memory_bytes=int64,
        error=text,
        results=training_files,
        log_lines=st.lists(text, max_size=3).map(tuple),
        detail=text,
    ),
    st.builds(
        TrainingPiece, job_id=text, filename=text, offset=int64, data=st.binary(max_size=16), error=text
    ),
)
control_messages = st.one_of(
    registereds,
    shard_specs,
    st.builds(StopShard, replica_id=text, reason=text),
    st.builds(SettingsUpdate, yaml=text),
    st.builds(RestartAgent, reason=text),
    st.builds(
        MirrorBuilds,
        builds=st.lists(
            st.builds(
                MirroredBuild,
                engine=text,
                version=text,
                variant=text,
                arch=text,
                assets=st.lists(st.builds(BuildAsset, name=text, sha256=text, size=int64), max_size=2).map(
                    tuple
                ),
            ),
            max_size=2,
        ).map(tuple),
    ),
    st.builds(
        UpgradeAgent,
        version=text,
        sums=text,
        signature=text,
        files=st.lists(st.builds(ReleaseFile, sha256=text, filename=text, size=int64), max_size=2).map(tuple),
    ),
    st.builds(Heartbeat, sent_unix_ms=int64),
    st.builds(
        LogRequest,
        request_id=text,
        replica_id=text,
        lines=st.integers(0, 2**31 - 1),
        follow=st.booleans(),
        cancel=st.booleans(),
    ),
    st.builds(
        StartTraining,
        job_id=text,
        attempt=int32,
        model=text,
        weights=training_files,
        device=text,
        memory_mb=int64,
        pairs=st.binary(max_size=16),
        options=text.filter(bool),
        gguf=st.booleans(),
    ),
    st.builds(CancelTraining, job_id=text, reason=text),
    st.builds(TrainingFetch, job_id=text, filename=text, offset=int64, length=int32),
    st.builds(TrainingCollected, job_id=text),
)


@given(agent_messages)
def test_an_agent_message_survives_the_round_trip(message: AgentMessage) -> None:
    wire = pb.AgentMessage.FromString(encode_agent_message(message).SerializeToString())
    assert decode_agent_message(wire) == message


@given(control_messages)
def test_a_control_message_survives_the_round_trip(message: ControlMessage) -> None:
    wire = pb.ControlMessage.FromString(encode_control_message(message).SerializeToString())
    assert decode_control_message(wire) == message


def test_kv_blocks_take_the_model_the_receiver_names() -> None:
    """The wire carries no model: the control plane knows each replica's and names it."""
    update = KvBlocksUpdate(model="qwen", replica_id="r1", stored=(1, 2**64 - 1), block_size=32)
    decoded = decode_kv_blocks(encode_kv_blocks(update), model="qwen")
    assert decoded == update


def test_an_empty_envelope_decodes_to_nothing() -> None:
    assert decode_agent_message(pb.AgentMessage()) is None
    assert decode_control_message(pb.ControlMessage()) is None


async def test_links_carry_core_messages_and_skip_unknown_kinds() -> None:
    agent_side, control_side = memory_pair("node1")
    agent, control = agent_link(agent_side), control_link(control_side)
    await control_side.send(pb.ControlMessage())  # a kind this version does not know
    await control.send(StopShard(replica_id="r1", reason="idle"))
    await agent.send(Telemetry(reader="nvml"))
    assert await asyncio.wait_for(agent.receive(), 5) == StopShard(replica_id="r1", reason="idle")
    assert await asyncio.wait_for(control.receive(), 5) == Telemetry(reader="nvml")
    assert control.peer == "node1"


async def test_a_status_is_on_the_wire_as_the_protocol_says() -> None:
    """The other side of the stream may be an older agent: what a link sends is the wire's message."""
    agent_side, control_side = memory_pair("node1")
    await agent_link(agent_side).send(ShardStatus(replica_id="r1", state=ShardState.READY, port=8080))
    wire = await asyncio.wait_for(control_side.receive(), 5)
    assert wire.status.state == pb.SHARD_STATE_READY
    assert (wire.status.replica_id, wire.status.port) == ("r1", 8080)
