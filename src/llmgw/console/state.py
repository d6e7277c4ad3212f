"""What the console knows of the cluster: the latest answer of each admin route, parsed.

The events stream (and polling, against an older control plane) delivers
each kind whole, in the shape its GET route answers; :meth:`ClusterData.apply`
parses one into the admin API's models. Views read attributes only. GPU
readings come from the control plane's ``/metrics`` (the agents' telemetry),
joined to the cards ``/api/nodes`` lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from pydantic import JsonValue, TypeAdapter, ValidationError

from llmgw.adminapi.batches import BatchView
from llmgw.adminapi.schemas import (
    BlobView,
    KeyView,
    ModelView,
    NodeView,
    ReplicaView,
    ServingView,
    SettingChange,
    StatusView,
)
from llmgw.adminapi.training import TrainingJobView
from llmgw.adminapi.usage import UsageAnswer
from llmgw.errors import LlmgwError

STREAMED = ("status", "nodes", "replicas", "models", "settings", "serving", "keys")
"""The kinds ``/api/events`` sends, each whole, once on connect and again on every change."""

FETCHED = ("blobs", "history", "usage", "gpus", "training", "batches")
"""The kinds the console asks for itself (on opening their view, on refresh, every few seconds)."""

_SHAPES: dict[str, TypeAdapter[Any]] = {
    "status": TypeAdapter(StatusView),
    "nodes": TypeAdapter(list[NodeView]),
    "replicas": TypeAdapter(list[ReplicaView]),
    "models": TypeAdapter(list[ModelView]),
    "settings": TypeAdapter(dict[str, JsonValue]),
    "serving": TypeAdapter(ServingView),
    "keys": TypeAdapter(list[KeyView]),
    "blobs": TypeAdapter(list[BlobView]),
    "history": TypeAdapter(list[SettingChange]),
    "usage": TypeAdapter(UsageAnswer),
    "training": TypeAdapter(list[TrainingJobView]),
    "batches": TypeAdapter(list[BatchView]),
}

_READINGS = {
    "llmgw_gpu_utilization_ratio": ("utilization", 100.0),
    "llmgw_gpu_memory_used_bytes": ("memory_used_mb", 1.0 / (1 << 20)),
    "llmgw_gpu_memory_total_bytes": ("memory_total_mb", 1.0 / (1 << 20)),
    "llmgw_gpu_temperature_celsius": ("temperature_c", 1.0),
}
"""The GPU gauges the console shows: the reading's name and the factor from the metric's unit."""


@dataclass
class GpuReading:
    """The last telemetry of one device (a card or a MIG instance); None where it gives none."""

    utilization: float | None = None
    """Percent of time computing (MIG instances give none)."""
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    temperature_c: float | None = None


def gpu_readings(metrics: str) -> dict[tuple[str, str], GpuReading]:
    """Each device's readings in a ``/metrics`` text, by (node, device label: ``3`` or ``0/mig1``)."""
    out: dict[tuple[str, str], GpuReading] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            known = _READINGS.get(sample.name)
            if known is None or "node" not in sample.labels or "device" not in sample.labels:
                continue
            reading = out.setdefault((sample.labels["node"], sample.labels["device"]), GpuReading())
            setattr(reading, known[0], sample.value * known[1])
    return out


@dataclass
class ClusterData:
    """The latest of each kind; None (or empty) until it first arrives."""

    status: StatusView | None = None
    nodes: list[NodeView] = field(default_factory=list)
    replicas: list[ReplicaView] = field(default_factory=list)
    models: list[ModelView] = field(default_factory=list)
    settings: dict[str, JsonValue] = field(default_factory=dict)
    serving: ServingView | None = None
    keys: list[KeyView] = field(default_factory=list)
    blobs: list[BlobView] = field(default_factory=list)
    history: list[SettingChange] = field(default_factory=list)
    usage: UsageAnswer | None = None
    training: list[TrainingJobView] = field(default_factory=list)
    batches: list[BatchView] = field(default_factory=list)
    gpus: dict[tuple[str, str], GpuReading] = field(default_factory=dict)

    def apply(self, kind: str, data: Any) -> None:
        """Take one kind's answer (JSON as its route gives it; the ``/metrics`` text for ``gpus``)."""
        if kind == "gpus":
            self.gpus = gpu_readings(str(data))
            return
        shape = _SHAPES.get(kind)
        if shape is None:
            return  # a kind a newer control plane sends: nothing here shows it
        try:
            value = shape.validate_python(data)
        except ValidationError as error:
            raise LlmgwError(
                f"the control plane sent {kind} in a shape this llmgw does not read: "
                f"{error.errors()[0]['msg']}",
                "run the same llmgw version here as on the control plane ('llmgw version')",
            ) from None
        setattr(self, kind, value)

    @property
    def stopped(self) -> bool:
        """Whether ``llmgw stop`` is in force (the serving event, else the status)."""
        if self.serving is not None:
            return self.serving.stopped
        return self.status.stopped if self.status is not None else False
