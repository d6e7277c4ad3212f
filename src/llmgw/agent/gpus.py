"""What the NVIDIA cards on a node are and hold, read through one interface.

Two readers stand behind :class:`GpuSource`: NVML (``nvidia-ml-py``), used
when the library loads and ``nvmlInit`` succeeds, and ``nvidia-smi -q -x``
otherwise. Both give a :class:`GpuReport`: the cards, their MIG instances,
the processes on them and the readings telemetry samples. :func:`devices_of`
turns a report into the devices placement sees: a card, or each instance of a
card in MIG mode, or a MIG card with nothing carved marked unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llmgw.core.devices import Device, gpu_class
from llmgw.core.mig import mig_class, mig_number


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a card or a MIG instance."""

    pid: int
    name: str
    used_mb: int
    gpu_instance_id: int | None = None
    """The MIG GPU instance it runs in; None outside MIG."""
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class MigInstance:
    """One MIG device of a card: a compute instance in a GPU instance."""

    index: int
    """The MIG device's number on its card (``Device N`` in ``nvidia-smi -L``)."""
    uuid: str
    """``MIG-…``; what ``CUDA_VISIBLE_DEVICES`` names."""
    profile: str
    """``3g.40gb``; empty when neither reader could tell."""
    gpu_instance_id: int
    compute_instance_id: int
    memory_mb: int
    memory_free_mb: int
    multiprocessors: int = 0
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Card:
    """One physical card with its readings; None where the card does not say."""

    index: int
    name: str
    uuid: str
    memory_mb: int
    memory_free_mb: int
    pci_bus_id: str = ""
    mig_current: str = "N/A"
    """``Enabled``, ``Disabled`` or ``N/A`` (a card that cannot do MIG)."""
    mig_pending: str = "N/A"
    """The mode after the next reset; differs from ``mig_current`` while a change waits."""
    instances: tuple[MigInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    """Processes on the whole card; on a MIG card they are also listed per instance."""
    utilization_percent: int | None = None
    memory_bandwidth_percent: int | None = None
    """Share of time the memory was read or written (nvidia-smi's ``memory_util``)."""
    sm_clock_mhz: int | None = None
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (volatile); None without ECC."""
    temperature_c: int | None = None
    power_w: float | None = None

    @property
    def mig_enabled(self) -> bool:
        return self.mig_current.strip().lower() == "enabled"

    @property
    def mig_change_pending(self) -> bool:
        return self.mig_pending.strip().lower() != self.mig_current.strip().lower()

    @property
    def card_class(self) -> str:
        return gpu_class(self.name, self.memory_mb)


@dataclass(frozen=True)
class GpuReport:
    """Everything one read of the cards gave."""

    cards: tuple[Card, ...]
    driver_version: str = ""
    reader: str = ""
    """``nvml`` or ``nvidia-smi``."""


class GpuSource(Protocol):
    """Reads the node's cards; nvidia-smi and NVML both answer it."""

    name: str

    async def read(self) -> GpuReport | None:
        """The cards now, or None when they cannot be read (no driver, no tool)."""
        ...

    async def nvlink_errors(self) -> dict[int, dict[int, dict[str, int]]]:
        """NVLink error counters: card → link → counter name → count."""
        ...


def unavailable_reason(card: Card) -> str:
    """Why a card stays out of placement, naming the fix; empty when it can serve."""
    if card.mig_enabled and not card.instances:
        return (
            f"MIG mode is on and no instance is carved: list the profiles with "
            f"'nvidia-smi mig -i {card.index} -lgip' and carve with "
            f"'nvidia-smi mig -i {card.index} -cgi PROFILE -C', or turn MIG off with "
            f"'nvidia-smi -i {card.index} -mig 0' and reset the card"
        )
    return ""


def devices_of(report: GpuReport) -> list[Device]:
    """The devices placement sees: whole cards, MIG instances, unusable cards marked so."""
    devices = []
    for card in report.cards:
        card_class = card.card_class
        if not card.mig_enabled or not card.instances:
            reason = unavailable_reason(card)
            devices.append(
                Device(
                    kind="nvidia",
                    index=card.index,
                    name=card.name,
                    memory_mb=card.memory_mb,
                    memory_free_mb=0 if reason else card.memory_free_mb,
                    uuid=card.uuid,
                    device_class=card_class,
                    unavailable=reason,
                )
            )
            continue
        for instance in card.instances:
            profile = instance.profile or f"{instance.memory_mb // 1024}gb"
            devices.append(
                Device(
                    kind="nvidia",
                    index=mig_number(card.index, instance.index),
                    name=f"{card.name} MIG {profile}",
                    memory_mb=instance.memory_mb,
                    memory_free_mb=instance.memory_free_mb,
                    uuid=instance.uuid,
                    device_class=mig_class(card_class, profile),
                    mig_profile=profile,
                )
            )
    return devices


def processes_by_device(report: GpuReport) -> dict[int, tuple[GpuProcess, ...]]:
    """The processes on each placement device (card index or MIG number)."""
    held: dict[int, tuple[GpuProcess, ...]] = {}
    for card in report.cards:
        if card.mig_enabled and card.instances:
            for instance in card.instances:
                held[mig_number(card.index, instance.index)] = instance.processes
        else:
            held[card.index] = card.processes
    return held
