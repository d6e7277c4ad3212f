"""Hypothesis strategies for the core types that cross the agent stream (ranges the wire's fields hold)."""

from __future__ import annotations

from hypothesis import strategies as st

from llmgw.core.devices import Device, NodeInventory
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.nodes import NodeRegistration, Registered, SettingsRefusal
from llmgw.core.shards import (
    AdapterSpec,
    Compute,
    FetchProgress,
    Rendezvous,
    RunningShard,
    ShardSpec,
    ShardState,
    ShardStatus,
    WeightsFile,
)
from llmgw.core.telemetry import DeviceSample, ForeignProcess, NvLinkErrors, Telemetry, XidEvent

text = st.text(st.characters(codec="utf-8"), max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
uint32 = st.integers(0, 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
uint64 = st.integers(0, 2**64 - 1)
real = st.floats(allow_nan=False)
small = {"max_size": 3}

weights_files = st.builds(WeightsFile, sha256=text, filename=text, size=int64)
adapters = st.builds(
    AdapterSpec,
    name=text,
    sha256=text,
    filename=text,
    size=int64,
    files=st.tuples(weights_files) | st.just(()),
    scale=st.none() | real,
)
shard_specs = st.builds(
    ShardSpec,
    replica_id=text,
    model=text,
    engine=text,
    weights_sha256=text,
    weights_filename=text,
    weights_size=int64,
    weights_format=text,
    files=st.lists(weights_files, **small).map(tuple),
    projector_sha256=text,
    projector_filename=text,
    projector_size=int64,
    args=st.lists(text, **small).map(tuple),
    env=st.dictionaries(text, text, **small),
    api_key=text,
    devices=st.lists(int32, **small).map(tuple),
    ctx_size=int32,
    parallel=int32,
    tp=int32,
    kv_events=st.booleans(),
    max_loaded_adapters=int32,
    adapters=st.lists(adapters, **small).map(tuple),
    max_lora_rank=int32,
    pp=int32,
    rendezvous=st.none() | st.builds(Rendezvous, rank=int32, nodes=st.integers(1, 2**31 - 1), address=text),
)
computes = st.builds(
    Compute,
    backend=text,
    devices=st.lists(int32, **small).map(tuple),
    layers_offloaded=int32,
    memory_mb=int64,
)
shard_states = st.sampled_from(ShardState)
adapter_paths = st.dictionaries(text, text, **small)
fetch_progress = st.builds(
    FetchProgress, done=int64, total=int64, bytes_per_s=st.floats(allow_nan=False, allow_infinity=False)
)
shard_statuses = st.builds(
    ShardStatus,
    replica_id=text,
    state=shard_states,
    port=int32,
    compute=computes,
    error=text,
    restarts=int32,
    adapter_paths=adapter_paths,
    fetching=st.none() | fetch_progress,
)
running_shards = st.builds(
    RunningShard,
    replica_id=text,
    model=text,
    state=shard_states,
    port=int32,
    compute=computes,
    error=text,
    adapter_paths=adapter_paths,
)
devices = st.builds(
    Device,
    kind=text,
    index=int32,
    name=text,
    memory_mb=int64,
    memory_free_mb=int64,
    uuid=text,
    device_class=text,
    mig_profile=text,
    unavailable=text,
)
inventories = st.builds(
    NodeInventory,
    node_id=text,
    address=text,
    cpu_cores=int32,
    memory_mb=int64,
    devices=st.lists(devices, **small).map(tuple),
    driver_version=text,
)
registrations = st.builds(
    NodeRegistration,
    inventory=inventories,
    shards=st.lists(running_shards, **small).map(tuple),
    engines=st.lists(text, **small).map(tuple),
    agent_version=text,
    refused_settings=st.none() | st.builds(SettingsRefusal, settings=text, reason=text, refused_at=real),
)
registereds = st.builds(
    Registered,
    leader=text,
    control_planes=st.lists(text, **small).map(tuple),
    standby=st.booleans(),
    leader_address=text,
)
samples = st.builds(
    DeviceSample,
    device=int32,
    uuid=text,
    device_class=text,
    memory_used_mb=int64,
    memory_total_mb=int64,
    utilization_percent=st.none() | int32,
    memory_bandwidth_percent=st.none() | int32,
    sm_clock_mhz=st.none() | int32,
    ecc_uncorrected=st.none() | int64,
    temperature_c=st.none() | int32,
    power_w=st.none() | real,
)
telemetries = st.builds(
    Telemetry,
    sampled_unix_ms=int64,
    samples=st.lists(samples, **small).map(tuple),
    foreign=st.lists(
        st.builds(ForeignProcess, device=int32, pid=int32, name=text, used_mb=int64), **small
    ).map(tuple),
    full=st.booleans(),
    nvlink=st.lists(
        st.builds(NvLinkErrors, card=int32, link=int32, counters=st.dictionaries(text, int64, **small)),
        **small,
    ).map(tuple),
    xids=st.lists(st.builds(XidEvent, card=int32, xid=int32, line=text), **small).map(tuple),
    reader=text,
)
kv_updates = st.builds(
    KvBlocksUpdate,
    model=st.just(""),
    replica_id=text,
    stored=st.lists(uint64, **small).map(tuple),
    removed=st.lists(uint64, **small).map(tuple),
    reset=st.booleans(),
    hash_seed=text,
    block_size=st.integers(1, 2**31 - 1),
)
