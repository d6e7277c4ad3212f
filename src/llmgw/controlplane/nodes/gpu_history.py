"""A short history of each card's readings, kept in the leader's memory for the portal's charts.

Agents send a :class:`~llmgw.core.telemetry.Telemetry` sample every 10 s
(:mod:`llmgw.agent.telemetry`); :class:`GpuHistory` keeps the last
:data:`POINTS_PER_CARD` of them per device (an hour), newest last. Prometheus
keeps the long history (:mod:`llmgw.observability.gpu_metrics`); this one
is what ``/api/gpu-history`` answers, so the portal charts a node without a
Prometheus server. A device a node stops reporting (a MIG layout changed, a
card gone) is dropped with its points; a node that goes away keeps its
history, so its last readings can still be looked at.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from llmgw.core.mig import device_label
from llmgw.core.telemetry import DeviceSample, Telemetry

POINTS_PER_CARD = 360
"""Readings kept per device: an hour at the agents' 10 s interval."""


@dataclass(frozen=True)
class CardPoint:
    """One device's readings at one time (None: the device gave no value)."""

    at_ms: int
    """When the agent sampled it (Unix milliseconds)."""
    memory_used_mb: int
    memory_total_mb: int
    utilization_percent: int | None
    memory_bandwidth_percent: int | None
    temperature_c: int | None
    power_w: float | None
    sm_clock_mhz: int | None


@dataclass
class CardHistory:
    """One device's recent readings, oldest first."""

    node: str
    device: int
    """The card's index, or 1000 + 100 x card + instance for a MIG instance."""
    device_class: str
    points: deque[CardPoint] = field(default_factory=deque)

    @property
    def label(self) -> str:
        """How views show the device: ``3``, or ``0/mig2``."""
        return device_label(self.device)


def _point(at_ms: int, sample: DeviceSample) -> CardPoint:
    return CardPoint(
        at_ms=at_ms,
        memory_used_mb=sample.memory_used_mb,
        memory_total_mb=sample.memory_total_mb,
        utilization_percent=sample.utilization_percent,
        memory_bandwidth_percent=sample.memory_bandwidth_percent,
        temperature_c=sample.temperature_c,
        power_w=sample.power_w,
        sm_clock_mhz=sample.sm_clock_mhz,
    )


class GpuHistory:
    """The last readings of every device of every node that sent telemetry."""

    def __init__(self, points_per_card: int = POINTS_PER_CARD, wall: Callable[[], float] = time.time) -> None:
        if points_per_card < 1:
            raise ValueError(f"points_per_card must be at least 1, not {points_per_card}")
        self._points = points_per_card
        self._wall = wall
        self._nodes: dict[str, dict[int, CardHistory]] = {}

    def add(self, node: str, telemetry: Telemetry) -> None:
        """Append one sample of ``node``; devices the sample no longer names are dropped."""
        at_ms = telemetry.sampled_unix_ms or int(self._wall() * 1000)
        before = self._nodes.get(node, {})
        now: dict[int, CardHistory] = {}
        for sample in telemetry.samples:
            card = before.get(sample.device)
            if card is None or card.device_class != sample.device_class:
                card = CardHistory(node, sample.device, sample.device_class, deque(maxlen=self._points))
            card.points.append(_point(at_ms, sample))
            now[sample.device] = card
        self._nodes[node] = now

    def cards(self, node: str | None = None) -> Iterator[CardHistory]:
        """Every device's history (or only ``node``'s), by node then device number."""
        for node_id in sorted(self._nodes):
            if node is None or node_id == node:
                for device in sorted(self._nodes[node_id]):
                    yield self._nodes[node_id][device]
