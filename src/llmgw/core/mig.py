"""MIG: a card cut into instances, how they are numbered, named and limited.

A card in MIG mode is not offered whole: each of its instances is a device of
its own, with its own memory, MIG UUID and a class made of the card's class
and the instance's profile (``a100-80g-mig-3g.40gb``). Placement numbers an
instance ``1000 + 100 x card + instance`` so it never collides with a card's
index, and every view shows it as ``card/migN``.

A process opens exactly one MIG device and instances have no NVLink between
them, so a replica on a MIG class runs on exactly one instance: tensor or
pipeline parallelism, several GPUs or several nodes are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIG_BASE = 1000
"""The first MIG device number: instance 0 of card 0."""
MIG_PER_CARD = 100
"""Numbers each card's instances take (a card has at most seven)."""

_PROFILE = re.compile(r"^\d+(?:c\.\d+)?g\.\d+gb(?:\+me(?:\.all)?)?$")
"""``1g.10gb``, ``4c.7g.80gb`` (compute instance of a larger one), ``1g.10gb+me``."""


def mig_number(card: int, instance: int) -> int:
    """The device number placement gives instance ``instance`` of card ``card``."""
    if card < 0 or not 0 <= instance < MIG_PER_CARD:
        raise ValueError(f"no MIG number for card {card} instance {instance}")
    return MIG_BASE + MIG_PER_CARD * card + instance


def is_mig_number(number: int) -> bool:
    """True when ``number`` names a MIG instance rather than a whole card."""
    return number >= MIG_BASE


def mig_parts(number: int) -> tuple[int, int]:
    """(card, instance) of a MIG device number."""
    if not is_mig_number(number):
        raise ValueError(f"{number} is a card's index, not a MIG device number")
    return divmod(number - MIG_BASE, MIG_PER_CARD)


def device_label(number: int) -> str:
    """How views show a device: ``3`` for a card, ``0/mig2`` for an instance."""
    if not is_mig_number(number):
        return str(number)
    card, instance = mig_parts(number)
    return f"{card}/mig{instance}"


def parse_device_label(label: str) -> int:
    """The device number a view's label stands for (``0/mig2`` → 1002); ValueError otherwise."""
    found = re.fullmatch(r"\s*(\d+)(?:/mig(\d+))?\s*", label)
    if not found:
        raise ValueError(f"{label!r} is neither a card (3) nor a MIG instance (0/mig2)")
    card = int(found.group(1))
    return mig_number(card, int(found.group(2))) if found.group(2) is not None else card


def normalise_profile(text: str) -> str:
    """The profile in a MIG name: ``MIG 3g.40gb`` or ``NVIDIA A100-SXM4-80GB MIG 3g.40gb`` → ``3g.40gb``.

    Returns an empty string when the text names no profile.
    """
    for word in reversed(text.replace("MIG", " ").split()):
        if _PROFILE.match(word.lower()):
            return word.lower()
    return ""


def mig_class(card_class: str, profile: str) -> str:
    """An instance's class: the card's and the profile's, ``a100-80g-mig-3g.40gb``."""
    return f"{card_class}-mig-{profile}"


def is_mig_class(device_class: str) -> bool:
    """True for a class of MIG instances."""
    return "-mig-" in device_class


@dataclass(frozen=True)
class Spread:
    """Over how many devices a replica spreads; all 1 is one device."""

    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    gpus: int = 1
    """GPUs per node the replica asks for."""
    nodes: int = 1
    """Nodes the replica spans."""

    @property
    def single_device(self) -> bool:
        return max(self.tp, self.pp, self.gpus, self.nodes) <= 1


def mig_refusal(device_class: str, spread: Spread) -> str:
    """Why a replica spread like ``spread`` cannot run on ``device_class``; empty when it can.

    Only MIG classes refuse: a MIG instance is one device, and a replica on it
    runs on exactly that one.
    """
    if not is_mig_class(device_class) or spread.single_device:
        return ""
    asked = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("tp", spread.tp),
            ("pp", spread.pp),
            ("gpus", spread.gpus),
            ("nodes", spread.nodes),
        )
        if value > 1
    )
    return (
        f"{device_class} is a MIG instance and a replica on MIG runs on exactly one instance, "
        f"but this one asks for {asked}: set tp, pp, gpus and nodes to 1, or choose a class of whole cards"
    )


PCI_BUS_ORDER = "PCI_BUS_ID"
"""``CUDA_DEVICE_ORDER`` numbering cards as nvidia-smi does (CUDA's default is ``FASTEST_FIRST``)."""


def visible_devices(numbers: tuple[int, ...], uuids: dict[int, str]) -> dict[str, str]:
    """The environment that shows an engine the devices placement gave it.

    Whole cards go by index (``CUDA_VISIBLE_DEVICES=0,1``, and the same cards
    for Vulkan builds in ``GGML_VK_VISIBLE_DEVICES``); a MIG instance goes by
    its UUID (``CUDA_VISIBLE_DEVICES=MIG-…``) and gets no Vulkan variable,
    since Vulkan does not see MIG devices. ``uuids`` maps device numbers to
    UUIDs; a MIG number without one raises ValueError.

    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` comes with them: the indexes are
    nvidia-smi's and NVML's, in PCI bus order, while CUDA numbers cards fastest
    first by default, so on a node with mixed cards index 0 could be another card.
    """
    if not numbers:
        return {}
    migs = [n for n in numbers if is_mig_number(n)]
    if migs:
        if len(numbers) > 1:
            raise ValueError(f"a replica on MIG runs on exactly one instance, not {len(numbers)} devices")
        uuid = uuids.get(migs[0], "")
        if not uuid.startswith("MIG-"):
            raise ValueError(f"MIG device {device_label(migs[0])} has no MIG UUID to name it by")
        return {"CUDA_DEVICE_ORDER": PCI_BUS_ORDER, "CUDA_VISIBLE_DEVICES": uuid}
    cards = ",".join(str(n) for n in numbers)
    return {
        "CUDA_DEVICE_ORDER": PCI_BUS_ORDER,
        "CUDA_VISIBLE_DEVICES": cards,
        "GGML_VK_VISIBLE_DEVICES": cards,
    }
