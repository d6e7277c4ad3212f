"""What a replica's node is sent to start it: its shard spec, from the model and the profile it runs."""

from __future__ import annotations

import secrets

from llmgw.controlplane.nodes.fleet import ReplicaState
from llmgw.core.catalog import Adapter, ModelDefinition, Profile
from llmgw.core.shards import AdapterSpec, Rendezvous, ShardSpec, WeightsFile


def shard_spec(
    replica: ReplicaState,
    model: ModelDefinition,
    devices: tuple[int, ...] = (),
    *,
    rendezvous: Rendezvous | None = None,
) -> ShardSpec:
    """The StartShard a replica's node is sent: the model's files, its profile and the replica's key
    (and, for a shard of a multi-node replica, its rank and where the shards meet)."""
    profile = profile_of(model, replica.profile)
    source = model.source
    assert source is not None, f"model {model.name} is served by its provider and never placed"
    return ShardSpec(
        replica_id=replica.replica_id,
        model=model.name,
        engine=profile.engine,
        weights_sha256=source.sha256,
        weights_filename=source.filename,
        weights_size=source.size,
        args=tuple(profile.args),
        env=dict(profile.env),
        api_key=replica.api_key,
        devices=devices,
        ctx_size=profile.ctx_size,
        parallel=profile.parallel,
        tp=profile.tp,
        pp=profile.pp,
        kv_events=profile.kv_events,
        max_loaded_adapters=profile.max_loaded_adapters,
        weights_format=source.format,
        projector_sha256=source.projector.sha256 if source.projector else "",
        projector_filename=source.projector.filename if source.projector else "",
        projector_size=source.projector.size if source.projector else 0,
        files=tuple(WeightsFile(sha256=f.sha256, filename=f.filename, size=f.size) for f in source.files),
        adapters=tuple(lora_adapter(a, profile.engine) for a in model.adapters),
        max_lora_rank=model.max_lora_rank(),
        serves=profile.serves.value,
        pooling=profile.pooling or "",
        rendezvous=rendezvous,
        comfyui_nodes=tuple(node.model_dump_json() for node in model.comfyui.nodes) if model.comfyui else (),
        comfyui_hf_repository=model.comfyui.hf_repository if model.comfyui else "",
    )


def profile_of(model: ModelDefinition, index: int) -> Profile:
    """The model's profile ``index`` (the first when the catalog no longer has that many)."""
    return model.profiles[index] if 0 <= index < len(model.profiles) else model.profiles[0]


def lora_adapter(adapter: Adapter, engine: str) -> AdapterSpec:
    """What a node needs of an adapter to fetch it and give it to the engine."""
    return AdapterSpec(
        name=adapter.name,
        sha256=adapter.sha256,
        filename=adapter.weights_filename(engine),
        size=adapter.size,
        files=tuple(WeightsFile(sha256=f.sha256, filename=f.filename, size=f.size) for f in adapter.files),
        scale=adapter.scale,
    )


def replica_key() -> str:
    """A new replica's own API key.

    Engines read it from a file or a variable (never their command line);
    it is one line that starts with a letter (a line starting with ``#`` is a
    comment in llama-server's key file).
    """
    return "llmgw-replica-" + secrets.token_urlsafe(24)
