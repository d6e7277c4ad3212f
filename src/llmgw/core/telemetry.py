"""What a node's cards are doing, as the agent samples it and the control plane consumes it.

A :class:`Telemetry` sample comes every few seconds; every minute a *full*
one also carries the NVLink error counters and new Xid lines from the
kernel log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceSample:
    """One device's readings: a whole card, or a MIG instance (with its card's heat, power and
    ECC, without utilisation, which MIG cards do not report). None: the reader gave no value."""

    device: int
    """The card's index, or 1000 + 100 x card + instance."""
    uuid: str = ""
    device_class: str = ""
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    utilization_percent: int | None = None
    memory_bandwidth_percent: int | None = None
    """The share of time memory was read or written."""
    sm_clock_mhz: int | None = None
    ecc_uncorrected: int | None = None
    """Volatile: since the driver loaded."""
    temperature_c: int | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class ForeignProcess:
    """A process holding memory on a device that is none of the agent's engines."""

    device: int
    pid: int
    name: str = ""
    used_mb: int = 0


@dataclass(frozen=True)
class NvLinkErrors:
    """One NVLink's error counters: ``replay``, ``recovery``, ``crc`` (or ``crc_flit``, ``crc_data``)."""

    card: int
    link: int
    counters: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class XidEvent:
    """An Xid line from the kernel log (``NVRM: Xid (PCI:0000:07:00): 79, ...``)."""

    card: int
    """-1 when the PCI address matches no card."""
    xid: int
    line: str = ""


@dataclass(frozen=True)
class Telemetry:
    """One sample of a node's devices."""

    sampled_unix_ms: int = 0
    samples: tuple[DeviceSample, ...] = ()
    foreign: tuple[ForeignProcess, ...] = ()
    full: bool = False
    nvlink: tuple[NvLinkErrors, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    reader: str = ""
    """``nvml`` or ``nvidia-smi``."""
