"""Devices a node offers: CPU memory and NVIDIA cards, each with a class."""

from __future__ import annotations

import functools
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
    mig_profile: str = ""
    """The MIG profile (``3g.40gb``) when the device is a MIG instance; empty otherwise."""
    unavailable: str = ""
    """Why placement must leave the device alone (a MIG card with nothing carved); empty if usable."""

    @property
    def is_mig(self) -> bool:
        """True for a MIG instance (numbered 1000 + 100 x card + instance)."""
        return bool(self.mig_profile)


@dataclass(frozen=True)
class NodeInventory:
    """What a node has, as its agent registered it."""

    node_id: str
    address: str
    cpu_cores: int
    memory_mb: int
    devices: tuple[Device, ...] = field(default_factory=tuple)
    driver_version: str = ""

    @functools.cached_property
    def gpus(self) -> tuple[Device, ...]:
        """The NVIDIA devices: whole cards and MIG instances, the unusable ones included (found once:
        placement asks for every node's on every replica placed)."""
        return tuple(d for d in self.devices if d.kind == "nvidia")


_MEMORY_SIZES = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 180, 192)
_VENDOR_WORDS = re.compile(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", flags=re.I)
_FAMILY_WORDS = ("rtx", "gtx", "titan")
"""Words that name a family rather than a card: the card is the next word (``RTX 4090``)."""
_VARIANT_WORDS = ("ti", "super")
"""Words after the model that make a different card (``RTX 4070 Ti SUPER``)."""


def gpu_class(name: str, memory_mb: int) -> str:
    """A card's class from its product name and memory: ``a100-80g``, ``rtx4090-24g``.

    Vendor and brand words are dropped, a family word (``RTX``, ``GTX``, ``TITAN``,
    ``RTX PRO``) joins the model number after it, ``Ti`` and ``SUPER`` stay on the
    model, and the memory is rounded to the nearest size cards are sold with (a
    card larger than any of them keeps its own size in GiB; an unknown size
    leaves the memory off).
    """
    words = name.strip()
    while _VENDOR_WORDS.match(words):
        words = _VENDOR_WORDS.sub("", words, count=1)
    parts = [part.lower() for part in re.split(r"[\s-]+", words) if part]
    if not parts:
        model = "gpu"
    else:
        model_parts = [parts[0]]
        rest = parts[1:]
        if parts[0] in _FAMILY_WORDS and rest:
            if rest[0] == "pro" and len(rest) > 1:
                model_parts.append(rest.pop(0))
            model_parts.append(rest.pop(0))
            while rest and rest[0] in _VARIANT_WORDS:
                model_parts.append(rest.pop(0))
        model = re.sub(r"[^a-z0-9]", "", "".join(model_parts)) or "gpu"
    if memory_mb <= 0:
        return model
    gib = memory_mb / 1024
    if gib > _MEMORY_SIZES[-1] * 1.1:
        return f"{model}-{round(gib)}g"
    rounded = min(_MEMORY_SIZES, key=lambda size: abs(size - gib))
    return f"{model}-{rounded}g"
