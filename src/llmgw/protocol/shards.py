"""Shards on the wire: spec, compute, status and stop, to and from the protocol's messages."""

from __future__ import annotations

from llmgw.core.shards import (
    AdapterSpec,
    Compute,
    FetchProgress,
    Rendezvous,
    RunningShard,
    ShardSpec,
    ShardState,
    ShardStatus,
    StopShard,
    WeightsFile,
)
from llmgw.protocol import agent_pb2 as pb

_STATES: dict[ShardState, pb.ShardState.ValueType] = {
    ShardState.UNKNOWN: pb.SHARD_STATE_UNSPECIFIED,
    ShardState.STARTING: pb.SHARD_STATE_STARTING,
    ShardState.READY: pb.SHARD_STATE_READY,
    ShardState.FAILED: pb.SHARD_STATE_FAILED,
    ShardState.STOPPED: pb.SHARD_STATE_STOPPED,
}
_STATES_BACK = {wire: state for state, wire in _STATES.items()}


def encode_state(state: ShardState) -> pb.ShardState.ValueType:
    return _STATES[state]


def decode_state(state: int) -> ShardState:
    """A state this side does not know (a newer agent's) reads as UNKNOWN."""
    return _STATES_BACK.get(state, ShardState.UNKNOWN)  # type: ignore[call-overload, no-any-return]


def _encode_file(file: WeightsFile) -> pb.WeightsFile:
    return pb.WeightsFile(sha256=file.sha256, filename=file.filename, size=file.size)


def _decode_file(message: pb.WeightsFile) -> WeightsFile:
    return WeightsFile(sha256=message.sha256, filename=message.filename, size=message.size)


def _encode_adapter(adapter: AdapterSpec) -> pb.LoraAdapter:
    message = pb.LoraAdapter(
        name=adapter.name,
        sha256=adapter.sha256,
        filename=adapter.filename,
        size=adapter.size,
        files=[_encode_file(f) for f in adapter.files],
    )
    if adapter.scale is not None:
        message.scale = adapter.scale
    return message


def _decode_adapter(message: pb.LoraAdapter) -> AdapterSpec:
    return AdapterSpec(
        name=message.name,
        sha256=message.sha256,
        filename=message.filename,
        size=message.size,
        files=tuple(_decode_file(f) for f in message.files),
        scale=message.scale if message.HasField("scale") else None,
    )


def encode_shard_spec(spec: ShardSpec) -> pb.StartShard:
    return pb.StartShard(
        replica_id=spec.replica_id,
        model=spec.model,
        engine=spec.engine,
        weights_sha256=spec.weights_sha256,
        weights_filename=spec.weights_filename,
        weights_size=spec.weights_size,
        weights_format=spec.weights_format,
        files=[_encode_file(f) for f in spec.files],
        projector_sha256=spec.projector_sha256,
        projector_filename=spec.projector_filename,
        projector_size=spec.projector_size,
        args=list(spec.args),
        env=dict(spec.env),
        api_key=spec.api_key,
        devices=list(spec.devices),
        ctx_size=spec.ctx_size,
        parallel=spec.parallel,
        tp=spec.tp,
        kv_events=spec.kv_events,
        max_loaded_adapters=spec.max_loaded_adapters,
        adapters=[_encode_adapter(a) for a in spec.adapters],
        max_lora_rank=spec.max_lora_rank,
        traceparent=spec.traceparent,
        serves="" if spec.serves == "chat" else spec.serves,  # empty on the wire: chat, as before
        pooling=spec.pooling,
        comfyui_nodes=list(spec.comfyui_nodes),
        comfyui_hf_repository=spec.comfyui_hf_repository,
        pp=spec.pp,
        rank=spec.rendezvous.rank if spec.rendezvous else 0,
        nodes=spec.rendezvous.nodes if spec.rendezvous else 0,
        rendezvous=spec.rendezvous.address if spec.rendezvous else "",
    )


def decode_shard_spec(message: pb.StartShard) -> ShardSpec:
    return ShardSpec(
        replica_id=message.replica_id,
        model=message.model,
        engine=message.engine,
        weights_sha256=message.weights_sha256,
        weights_filename=message.weights_filename,
        weights_size=message.weights_size,
        weights_format=message.weights_format,
        files=tuple(_decode_file(f) for f in message.files),
        projector_sha256=message.projector_sha256,
        projector_filename=message.projector_filename,
        projector_size=message.projector_size,
        args=tuple(message.args),
        env=dict(message.env),
        api_key=message.api_key,
        devices=tuple(message.devices),
        ctx_size=message.ctx_size,
        parallel=message.parallel,
        tp=message.tp,
        kv_events=message.kv_events,
        max_loaded_adapters=message.max_loaded_adapters,
        adapters=tuple(_decode_adapter(a) for a in message.adapters),
        max_lora_rank=message.max_lora_rank,
        traceparent=message.traceparent,
        serves=message.serves or "chat",
        pooling=message.pooling,
        comfyui_nodes=tuple(message.comfyui_nodes),
        comfyui_hf_repository=message.comfyui_hf_repository,
        pp=message.pp,
        rendezvous=Rendezvous(message.rank, message.nodes, message.rendezvous) if message.nodes else None,
    )


def shard_spec_bytes(spec: ShardSpec) -> bytes:
    """The spec serialised as the wire's StartShard (how a shard's state file keeps it)."""
    return encode_shard_spec(spec).SerializeToString()


def shard_spec_from_bytes(data: bytes) -> ShardSpec:
    """The spec :func:`shard_spec_bytes` made; ValueError when ``data`` is not one."""
    message = pb.StartShard()
    try:
        message.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError
        raise ValueError(f"not a shard spec: {error}") from None
    return decode_shard_spec(message)


def encode_compute(compute: Compute) -> pb.Compute:
    return pb.Compute(
        backend=compute.backend,
        devices=list(compute.devices),
        layers_offloaded=compute.layers_offloaded,
        memory_mb=compute.memory_mb,
    )


def decode_compute(message: pb.Compute) -> Compute:
    return Compute(
        backend=message.backend,
        devices=tuple(message.devices),
        layers_offloaded=message.layers_offloaded,
        memory_mb=message.memory_mb,
    )


def encode_shard_status(status: ShardStatus) -> pb.ShardStatus:
    message = pb.ShardStatus(
        replica_id=status.replica_id,
        state=encode_state(status.state),
        port=status.port,
        compute=encode_compute(status.compute),
        error=status.error,
        restarts=status.restarts,
        adapter_paths=dict(status.adapter_paths),
    )
    if status.fetching is not None:
        progress = status.fetching
        message.fetching.CopyFrom(
            pb.FetchProgress(done=progress.done, total=progress.total, bytes_per_s=progress.bytes_per_s)
        )
    return message


def decode_shard_status(message: pb.ShardStatus) -> ShardStatus:
    return ShardStatus(
        replica_id=message.replica_id,
        state=decode_state(message.state),
        port=message.port,
        compute=decode_compute(message.compute),
        error=message.error,
        restarts=message.restarts,
        adapter_paths=dict(message.adapter_paths),
        fetching=_decode_progress(message.fetching) if message.HasField("fetching") else None,
    )


def _decode_progress(message: pb.FetchProgress) -> FetchProgress:
    return FetchProgress(done=message.done, total=message.total, bytes_per_s=message.bytes_per_s)


def encode_running_shard(shard: RunningShard) -> pb.RunningShard:
    return pb.RunningShard(
        replica_id=shard.replica_id,
        model=shard.model,
        state=encode_state(shard.state),
        port=shard.port,
        compute=encode_compute(shard.compute),
        error=shard.error,
        adapter_paths=dict(shard.adapter_paths),
    )


def decode_running_shard(message: pb.RunningShard) -> RunningShard:
    return RunningShard(
        replica_id=message.replica_id,
        model=message.model,
        state=decode_state(message.state),
        port=message.port,
        compute=decode_compute(message.compute),
        error=message.error,
        adapter_paths=dict(message.adapter_paths),
    )


def encode_stop(stop: StopShard) -> pb.StopShard:
    return pb.StopShard(replica_id=stop.replica_id, reason=stop.reason)


def decode_stop(message: pb.StopShard) -> StopShard:
    return StopShard(replica_id=message.replica_id, reason=message.reason)
