"""A node's registration and the control plane's answer, to and from the protocol's messages.

The one place a registration is encoded (the agent's side) and decoded (the
control plane's side).
"""

from __future__ import annotations

from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration, Registered, SettingsRefusal
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.devices import device_message, device_of
from llmgw.protocol.shards import decode_running_shard, encode_running_shard


def encode_registration(registration: NodeRegistration) -> pb.Register:
    inventory = registration.inventory
    return pb.Register(
        node_id=inventory.node_id,
        address=inventory.address,
        cpu_cores=inventory.cpu_cores,
        memory_mb=inventory.memory_mb,
        devices=[device_message(d) for d in inventory.devices],
        driver_version=inventory.driver_version,
        shards=[encode_running_shard(s) for s in registration.shards],
        agent_version=registration.agent_version,
        engines=list(registration.engines),
        refused_settings=encode_refusal(registration.refused_settings),
    )


def encode_refusal(refusal: SettingsRefusal | None) -> pb.SettingsRefusal | None:
    if refusal is None:
        return None
    return pb.SettingsRefusal(
        settings=refusal.settings, reason=refusal.reason, refused_unix_s=refusal.refused_at
    )


def decode_refusal(message: pb.Register) -> SettingsRefusal | None:
    if not message.HasField("refused_settings"):
        return None
    refused = message.refused_settings
    return SettingsRefusal(
        settings=refused.settings, reason=refused.reason, refused_at=refused.refused_unix_s
    )


def decode_registration(message: pb.Register) -> NodeRegistration:
    inventory = NodeInventory(
        node_id=message.node_id,
        address=message.address,
        cpu_cores=message.cpu_cores,
        memory_mb=message.memory_mb,
        devices=tuple(device_of(d) for d in message.devices),
        driver_version=message.driver_version,
    )
    return NodeRegistration(
        inventory=inventory,
        shards=tuple(decode_running_shard(s) for s in message.shards),
        engines=tuple(message.engines),
        agent_version=message.agent_version,
        refused_settings=decode_refusal(message),
    )


def encode_registered(registered: Registered) -> pb.Registered:
    return pb.Registered(
        leader=registered.leader,
        control_planes=list(registered.control_planes),
        standby=registered.standby,
        leader_address=registered.leader_address,
    )


def decode_registered(message: pb.Registered) -> Registered:
    return Registered(
        leader=message.leader,
        control_planes=tuple(message.control_planes),
        standby=message.standby,
        leader_address=message.leader_address,
    )
