"""Devices a node offers: CPU memory and NVIDIA cards, each with a class."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Device:
    """One device an engine can run on."""

    kind: str
    """``cpu`` or ``nvidia``."""
    index: int
    """The device's number on its node (the CPU is 0)."""
    name: str
    """The product name, e.g. ``NVIDIA A100-SXM4-80GB``."""
    memory_mb: int
    """Total memory in MiB."""
    memory_free_mb: int
    """Free memory in MiB when last read."""
    uuid: str = ""
    """The card's UUID (empty for the CPU)."""
    device_class: str = ""
    """Class used by placement, e.g. ``a100-80g`` (``cpu`` for the CPU)."""


@dataclass(frozen=True)
class NodeInventory:
    """What a node has, as its agent registered it."""

    node_id: str
    address: str
    cpu_cores: int
    memory_mb: int
    devices: tuple[Device, ...] = field(default_factory=tuple)
    driver_version: str = ""

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind == "nvidia")


_MEMORY_SIZES = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 180, 192)


def gpu_class(name: str, memory_mb: int) -> str:
    """A card's class from its product name and memory: ``a100-80g``, ``rtx4090-24g``."""
    words = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", name.strip(), flags=re.I)
    words = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", words, flags=re.I)
    model = re.split(r"[\s-]", words, maxsplit=1)[0].lower() if words else "gpu"
    if model in ("rtx", "gtx") and " " in words:
        model = model + words.split()[1].lower()
    model = re.sub(r"[^a-z0-9]", "", model) or "gpu"
    gib = memory_mb / 1024
    rounded = min(_MEMORY_SIZES, key=lambda size: abs(size - gib))
    return f"{model}-{rounded}g"
