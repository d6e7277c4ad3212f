"""Devices cross the stream unchanged, every field included."""

from __future__ import annotations

from llmgw.core.devices import Device
from llmgw.protocol.devices import device_message, device_of


def test_a_mig_instance_survives_the_round_trip() -> None:
    device = Device(
        kind="nvidia",
        index=1102,
        name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        memory_mb=40192,
        memory_free_mb=39000,
        uuid="MIG-1234",
        device_class="a100-80g-mig-3g.40gb",
        mig_profile="3g.40gb",
        unavailable="",
    )
    assert device_of(device_message(device)) == device
