"""docs/metrics.md lists exactly the metrics the control plane and the agent register, with their types."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import Metric

import llmgw.controlplane.wiring  # noqa: F401 - everything the control plane registers as it imports
from llmgw.agent import metrics as agent_metrics
from llmgw.controlplane.metrics.clustermetrics import ClusterCollector
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.observability.gpu_metrics import GpuMetrics, process_gpu_metrics

DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
NOT_LEADING = SimpleNamespace(leading=False, epoch=None)
"""What the cluster collector reads of leadership, on a standby."""
ROW = re.compile(r"^\| `(llmgw_\w+)` \| (counter|gauge|histogram) \|", re.MULTILINE)


def _sections() -> dict[str, str]:
    """The doc's text under each heading (``## Agent``, ``### GPUs``, ...), by heading."""
    found: dict[str, str] = {}
    heading = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            found[heading] = ""
        else:
            found[heading] = found.get(heading, "") + line + "\n"
    return found


def _rows(*headings: str) -> set[tuple[str, str]]:
    sections = _sections()
    return {(name, kind) for heading in headings for name, kind in ROW.findall(sections[heading])}


def _exposed(families: list[Metric]) -> set[tuple[str, str]]:
    """Each llmgw family as it is scraped: a counter's samples end in ``_total``."""
    return {
        (f.name + "_total" if f.type == "counter" else f.name, f.type)
        for f in families
        if f.name.startswith("llmgw_")
    }


def control_plane_metrics() -> set[tuple[str, str]]:
    process_gpu_metrics()  # the GPU metrics a control plane serves, on its registry
    cluster = ClusterCollector(Fleet(lambda replica, url: None, lambda replica_id: None), NOT_LEADING)
    return _exposed(list(REGISTRY.collect())) | _exposed(list(cluster.collect()))


def agent_metrics_() -> set[tuple[str, str]]:
    return _exposed(list(agent_metrics.REGISTRY.collect()))


def test_the_control_planes_metrics_are_those_the_doc_lists() -> None:
    documented = _rows("Requests (`/v1`)", "Routing", "Cluster state", "GPUs")
    registered = control_plane_metrics()
    assert registered - documented == set(), "registered, not in docs/metrics.md"
    assert documented - registered == set(), "in docs/metrics.md, not registered"


def test_the_agents_metrics_are_those_the_doc_lists() -> None:
    documented = _rows("Agent", "GPUs")
    registered = agent_metrics_()
    assert registered - documented == set(), "registered, not in docs/metrics.md"
    assert documented - registered == set(), "in docs/metrics.md, not registered"


def test_gpu_metrics_are_the_same_in_both_processes() -> None:
    gpus = _exposed(list(GpuMetrics(CollectorRegistry()).registry.collect()))
    assert gpus == _rows("GPUs")
    assert gpus <= agent_metrics_() and gpus <= control_plane_metrics()
