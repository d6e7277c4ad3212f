"""Telemetry on the wire: a node's device samples to and from the protocol's messages.

The optional readings of a :class:`~llmgw.core.telemetry.DeviceSample` are
proto3 ``optional`` fields: None on one side is an absent field on the other.
"""

from __future__ import annotations

from typing import Any

from llmgw.core.telemetry import DeviceSample, ForeignProcess, NvLinkErrors, Telemetry, XidEvent
from llmgw.protocol import agent_pb2 as pb

_OPTIONAL = (
    "utilization_percent",
    "memory_bandwidth_percent",
    "sm_clock_mhz",
    "ecc_uncorrected",
    "temperature_c",
    "power_w",
)


def _encode_sample(sample: DeviceSample) -> pb.DeviceSample:
    readings: dict[str, Any] = {
        name: getattr(sample, name) for name in _OPTIONAL if getattr(sample, name) is not None
    }
    return pb.DeviceSample(
        device=sample.device,
        uuid=sample.uuid,
        device_class=sample.device_class,
        memory_used_mb=sample.memory_used_mb,
        memory_total_mb=sample.memory_total_mb,
        **readings,
    )


def _decode_sample(message: pb.DeviceSample) -> DeviceSample:
    readings: dict[str, Any] = {
        name: getattr(message, name) if message.HasField(name) else None  # type: ignore[arg-type]
        for name in _OPTIONAL
    }
    return DeviceSample(
        device=message.device,
        uuid=message.uuid,
        device_class=message.device_class,
        memory_used_mb=message.memory_used_mb,
        memory_total_mb=message.memory_total_mb,
        **readings,
    )


def encode_telemetry(telemetry: Telemetry) -> pb.Telemetry:
    return pb.Telemetry(
        sampled_unix_ms=telemetry.sampled_unix_ms,
        samples=[_encode_sample(s) for s in telemetry.samples],
        foreign=[
            pb.ForeignProcess(device=p.device, pid=p.pid, name=p.name, used_mb=p.used_mb)
            for p in telemetry.foreign
        ],
        full=telemetry.full,
        nvlink=[
            pb.NvLinkErrors(card=e.card, link=e.link, counters=dict(e.counters)) for e in telemetry.nvlink
        ],
        xids=[pb.XidEvent(card=e.card, xid=e.xid, line=e.line) for e in telemetry.xids],
        reader=telemetry.reader,
    )


def decode_telemetry(message: pb.Telemetry) -> Telemetry:
    return Telemetry(
        sampled_unix_ms=message.sampled_unix_ms,
        samples=tuple(_decode_sample(s) for s in message.samples),
        foreign=tuple(
            ForeignProcess(device=p.device, pid=p.pid, name=p.name, used_mb=p.used_mb)
            for p in message.foreign
        ),
        full=message.full,
        nvlink=tuple(
            NvLinkErrors(card=e.card, link=e.link, counters=dict(e.counters)) for e in message.nvlink
        ),
        xids=tuple(XidEvent(card=e.card, xid=e.xid, line=e.line) for e in message.xids),
        reader=message.reader,
    )
