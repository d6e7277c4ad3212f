"""Devices on the wire: core's Device to and from the protocol's message, field by field."""

from __future__ import annotations

import dataclasses

from llmgw.core.devices import Device
from llmgw.protocol import agent_pb2 as pb

_FIELDS = tuple(f.name for f in dataclasses.fields(Device))


def device_message(device: Device) -> pb.Device:
    return pb.Device(**{name: getattr(device, name) for name in _FIELDS})


def device_of(message: pb.Device) -> Device:
    return Device(**{name: getattr(message, name) for name in _FIELDS})
