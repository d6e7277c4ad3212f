"""Prometheus metrics per card, from the telemetry samples nodes send.

Each device is labelled with its node, its number as views show it (``3`` or
``0/mig1``) and its class. Readings a device does not give (utilisation on a
MIG instance) are left out rather than set to zero, and the devices and
processes a node no longer reports are removed. Values are in base units
(bytes, hertz, ratios); the driver's own error counters are counters
(``_total``), set from each reading. docs/metrics.md lists every name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from llmgw.core.mig import device_label
from llmgw.core.telemetry import Telemetry

MIB = 1 << 20
_DEVICE = ("node", "device", "device_class")
_SAMPLED = {
    "utilization_percent": ("llmgw_gpu_utilization_ratio", "Share of time the device was computing.", 0.01),
    "memory_bandwidth_percent": (
        "llmgw_gpu_memory_bandwidth_ratio",
        "Share of time the device's memory was read or written.",
        0.01,
    ),
    "memory_used_mb": ("llmgw_gpu_memory_used_bytes", "Device memory in use.", MIB),
    "memory_total_mb": ("llmgw_gpu_memory_total_bytes", "Device memory.", MIB),
    "sm_clock_mhz": ("llmgw_gpu_sm_clock_hertz", "SM clock.", 1e6),
    "temperature_c": ("llmgw_gpu_temperature_celsius", "Card temperature.", 1),
    "power_w": ("llmgw_gpu_power_watts", "Card power draw.", 1),
}
"""Gauges: each sample's field, with the metric's name, help and the factor to its base unit."""


class ReadCounter(Collector):
    """A counter whose value is read from elsewhere (the driver's), per node: set, never incremented."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.values: dict[str, dict[tuple[str, ...], float]] = {}
        """By node: each label set's last reading."""

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labels)

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [self._family()]

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = self._family()
        for readings in list(self.values.values()):
            for labels, value in readings.items():
                family.add_metric(labels, value)
        yield family


class GpuMetrics:
    """The per-card metrics of one registry, updated from each node's telemetry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._gauges = {
            field: (Gauge(name, text, _DEVICE, registry=self.registry), scale)
            for field, (name, text, scale) in _SAMPLED.items()
        }
        self._ecc = ReadCounter(
            "llmgw_gpu_ecc_uncorrected_errors", "Uncorrected ECC errors since the driver loaded.", _DEVICE
        )
        self._foreign = Gauge(
            "llmgw_gpu_foreign_memory_bytes",
            "Memory held on a device by processes that are not llmgw's engines.",
            _DEVICE[:2],
            registry=self.registry,
        )
        self._nvlink = ReadCounter(
            "llmgw_gpu_nvlink_errors",
            "NVLink error counters since the driver loaded.",
            ("node", "card", "link", "counter"),
        )
        for counter in (self._ecc, self._nvlink):
            self.registry.register(counter)
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
        """Set the metrics from one sample of ``node``."""
        for field, (gauge, scale) in self._gauges.items():
            values: dict[tuple[str, ...], float] = {
                (node, device_label(s.device), s.device_class): float(getattr(s, field)) * scale
                for s in telemetry.samples
                if getattr(s, field) is not None
            }
            self._replace(node, field, gauge, values)
        self._ecc.values[node] = {
            (node, device_label(s.device), s.device_class): float(s.ecc_uncorrected)
            for s in telemetry.samples
            if s.ecc_uncorrected is not None
        }
        foreign: dict[tuple[str, ...], float] = {}
        for process in telemetry.foreign:
            key = (node, device_label(process.device))
            foreign[key] = foreign.get(key, 0.0) + process.used_mb * MIB
        self._replace(node, "foreign", self._foreign, foreign)
        if telemetry.full:
            self._nvlink.values[node] = {
                (node, str(e.card), str(e.link), counter): float(count)
                for e in telemetry.nvlink
                for counter, count in e.counters.items()
            }
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
