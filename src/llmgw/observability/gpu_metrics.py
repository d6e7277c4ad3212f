"""Prometheus metrics per card, from the telemetry samples nodes send.

Each device is labelled with its node, its number as views show it (``3`` or
``0/mig1``) and its class. Readings a device does not give (utilisation on a
MIG instance) are left out rather than set to zero, and the devices and
processes a node no longer reports are removed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmgw.core.mig import device_label
from llmgw.core.telemetry import Telemetry

_DEVICE = ("node", "device", "device_class")
_SAMPLED = {
    "utilization_percent": ("llmgw_gpu_utilization_percent", "Share of time the device was computing."),
    "memory_bandwidth_percent": (
        "llmgw_gpu_memory_bandwidth_percent",
        "Share of time the device's memory was read or written.",
    ),
    "memory_used_mb": ("llmgw_gpu_memory_used_mib", "Device memory in use, MiB."),
    "memory_total_mb": ("llmgw_gpu_memory_total_mib", "Device memory, MiB."),
    "sm_clock_mhz": ("llmgw_gpu_sm_clock_mhz", "SM clock, MHz."),
    "ecc_uncorrected": (
        "llmgw_gpu_ecc_uncorrected_errors",
        "Uncorrected ECC errors since the driver loaded.",
    ),
    "temperature_c": ("llmgw_gpu_temperature_celsius", "Card temperature."),
    "power_w": ("llmgw_gpu_power_watts", "Card power draw."),
}


class GpuMetrics:
    """The per-card gauges of one registry, updated from each node's telemetry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._gauges = {
            field: Gauge(name, text, _DEVICE, registry=self.registry)
            for field, (name, text) in _SAMPLED.items()
        }
        self._foreign = Gauge(
            "llmgw_gpu_foreign_memory_mib",
            "Memory held on a device by processes that are not llmgw's engines, MiB.",
            _DEVICE[:2],
            registry=self.registry,
        )
        self._nvlink = Gauge(
            "llmgw_gpu_nvlink_errors",
            "NVLink error counters since the driver loaded.",
            ("node", "card", "link", "counter"),
            registry=self.registry,
        )
        self._xids = Counter(
            "llmgw_gpu_xid_events",
            "Xid lines the kernel logged.",
            ("node", "card", "xid"),
            registry=self.registry,
        )
        self._labels: dict[str, dict[str, set[tuple[str, ...]]]] = {}

    def _replace(self, node: str, name: str, gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
        before = self._labels.setdefault(node, {}).get(name, set())
        for labels in before - set(values):
            gauge.remove(*labels)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        self._labels[node][name] = set(values)

    def update(self, node: str, telemetry: Telemetry) -> None:
        """Set the gauges from one sample of ``node``."""
        for field, gauge in self._gauges.items():
            values: dict[tuple[str, ...], float] = {
                (node, device_label(s.device), s.device_class): float(getattr(s, field))
                for s in telemetry.samples
                if getattr(s, field) is not None
            }
            self._replace(node, field, gauge, values)
        foreign: dict[tuple[str, ...], float] = {}
        for process in telemetry.foreign:
            key = (node, device_label(process.device))
            foreign[key] = foreign.get(key, 0.0) + process.used_mb
        self._replace(node, "foreign", self._foreign, foreign)
        if telemetry.full:
            self._replace(
                node,
                "nvlink",
                self._nvlink,
                {
                    (node, str(e.card), str(e.link), counter): float(count)
                    for e in telemetry.nvlink
                    for counter, count in e.counters.items()
                },
            )
        for event in telemetry.xids:
            self._xids.labels(node, str(event.card), str(event.xid)).inc()


_process_metrics: GpuMetrics | None = None


def process_gpu_metrics() -> GpuMetrics:
    """The per-card metrics of this process's default registry (what ``/metrics`` serves), made once."""
    global _process_metrics
    if _process_metrics is None:
        from prometheus_client import REGISTRY

        _process_metrics = GpuMetrics(REGISTRY)
    return _process_metrics
