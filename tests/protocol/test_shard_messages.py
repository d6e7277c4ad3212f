"""Shard specs, statuses and registrations cross the stream unchanged, every field included."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given

from llmgw.core.nodes import NodeRegistration
from llmgw.core.shards import AdapterSpec, ShardSpec, ShardState, ShardStatus
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.nodes import decode_registration, encode_registration
from llmgw.protocol.shards import (
    decode_shard_spec,
    decode_shard_status,
    decode_state,
    encode_shard_spec,
    encode_shard_status,
    shard_spec_bytes,
    shard_spec_from_bytes,
)

from .wire_strategies import registrations, shard_specs, shard_statuses


@given(shard_specs)
def test_a_shard_spec_survives_the_round_trip(spec: ShardSpec) -> None:
    wire = pb.StartShard.FromString(encode_shard_spec(spec).SerializeToString())
    assert decode_shard_spec(wire) == spec


@given(shard_statuses)
def test_a_shard_status_survives_the_round_trip(status: ShardStatus) -> None:
    wire = pb.ShardStatus.FromString(encode_shard_status(status).SerializeToString())
    assert decode_shard_status(wire) == status


@given(registrations)
def test_a_registration_survives_the_round_trip(registration: NodeRegistration) -> None:
    wire = pb.Register.FromString(encode_registration(registration).SerializeToString())
    assert decode_registration(wire) == registration


def test_an_adapter_without_a_scale_stays_without_one() -> None:
    spec = ShardSpec(replica_id="r1", adapters=(AdapterSpec(name="a", sha256="00", filename="a.gguf"),))
    wire = encode_shard_spec(spec)
    assert not wire.adapters[0].HasField("scale")
    assert decode_shard_spec(wire).adapters[0].scale is None


def test_a_state_a_newer_agent_added_reads_as_unknown() -> None:
    assert decode_state(99) is ShardState.UNKNOWN


def test_a_state_file_written_before_core_types_still_reads() -> None:
    """Shard state files keep the spec as the wire's bytes: one an older agent wrote is adopted."""
    old = pb.StartShard(replica_id="r1", model="m", args=["-ngl", "99"], env={"A": "1"}, devices=[0, 1])
    spec = shard_spec_from_bytes(base64.b64decode(base64.b64encode(old.SerializeToString())))
    assert (spec.replica_id, spec.args, dict(spec.env), spec.devices) == (
        "r1",
        ("-ngl", "99"),
        {"A": "1"},
        (0, 1),
    )
    assert shard_spec_bytes(spec) == old.SerializeToString()


def test_bytes_that_are_no_spec_are_refused() -> None:
    with pytest.raises(ValueError, match="not a shard spec"):
        shard_spec_from_bytes(b"\xff\xff\xff")
