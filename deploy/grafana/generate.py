"""Write llmgw's Grafana dashboards (``dashboards/*.json``) from the definitions below.

The JSON files are committed, so Grafana (or the Helm chart's ConfigMaps) can
load them as they are; ``tests/deploy/test_dashboards.py`` fails when they and
this file differ. Run ``python deploy/grafana/generate.py`` after a change.

Metric names are those of docs/metrics.md. Queries use Grafana's
``$__rate_interval`` and the template variables ``$node``, ``$device`` and
``$model`` (each ``=~`` matched, "All" being ``.*``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    queries: list[tuple[str, str]]
    """(PromQL, legend) pairs."""
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    description: str = ""
    stack: bool = False


@dataclass
class Row:
    title: str
    panels: list[Panel]
    repeat: str = ""
    """A template variable: the row is drawn once per value (a row per GPU card)."""


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[Row]
    variables: list[tuple[str, str]] = field(default_factory=list)
    """(name, label_values query) pairs, multi-valued with "All"."""


def variable(name: str, query: str) -> dict[str, object]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def panel_json(panel: Panel, ident: int, x: int, y: int) -> dict[str, object]:
    custom: dict[str, object] = {"lineWidth": 1, "fillOpacity": 10 if panel.stack else 0}
    if panel.stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    body: dict[str, object] = {
        "id": ident,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "custom": custom if panel.kind == "timeseries" else {}}
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
        if panel.kind == "timeseries"
        else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }
    return body


def dashboard_json(dashboard: Dashboard) -> dict[str, object]:
    panels: list[dict[str, object]] = []
    ident, y = 1, 0
    for row in dashboard.rows:
        row_panel: dict[str, object] = {
            "id": ident,
            "type": "row",
            "title": row.title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "panels": [],
        }
        if row.repeat:
            row_panel["repeat"] = row.repeat
        panels.append(row_panel)
        ident, y, x, tallest = ident + 1, y + 1, 0, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, tallest = 0, y + tallest, 0
            panels.append(panel_json(panel, ident, x, y))
            ident, x, tallest = ident + 1, x + panel.width, max(tallest, panel.height)
        y += tallest
    templating = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        *(variable(name, query) for name, query in dashboard.variables),
    ]
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["llmgw"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "",
        "graphTooltip": 1,
        "templating": {"list": templating},
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["llmgw"], "asDropdown": True, "title": "llmgw"}],
        "panels": panels,
    }


def quantile(q: float, histogram: str, selector: str = "", by: str = "") -> str:
    """The ``q`` quantile of ``histogram`` over ``$__rate_interval``, kept apart ``by`` some labels."""
    keep = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({keep}) (rate({histogram}_bucket{selector}[{RATE}])))"


def zero_when_none(numerator: str, denominator: str) -> str:
    """numerator / denominator, 0 (not "no data") while the numerator has no series."""
    return f"(({numerator}) or ({denominator}) * 0) / ({denominator})"


M = '{model=~"$model"}'
M5 = '{model=~"$model", code=~"5.."}'
G = '{node=~"$node", device=~"$device"}'
N = '{node=~"$node"}'

CLUSTER = Dashboard(
    uid="llmgw-cluster",
    title="llmgw / Cluster",
    description="Control planes, leadership, nodes, replicas, store and the gateway's traffic at a glance.",
    rows=[
        Row(
            "Overview",
            [
                Panel("Nodes connected", [("max(llmgw_nodes_connected)", "nodes")], kind="stat", width=4),
                Panel(
                    "Leaders",
                    [("sum(llmgw_leader)", "leaders")],
                    kind="stat",
                    width=4,
                    description="Control planes that lead now: 1 when healthy.",
                ),
                Panel(
                    "Lease epoch",
                    [("max(llmgw_lease_epoch)", "epoch")],
                    kind="stat",
                    width=4,
                    description="Grows by one at every change of leader.",
                ),
                Panel(
                    "Replicas ready", [('sum(llmgw_replicas{state="ready"})', "ready")], kind="stat", width=4
                ),
                Panel(
                    "Requests in flight",
                    [("sum(llmgw_gateway_requests_in_flight)", "in flight")],
                    kind="stat",
                    width=4,
                ),
                Panel(
                    "GPU memory in use",
                    [("sum(llmgw_gpu_memory_used_bytes) / sum(llmgw_gpu_memory_total_bytes)", "used")],
                    kind="stat",
                    width=4,
                    unit="percentunit",
                ),
            ],
        ),
        Row(
            "Control planes",
            [
                Panel(
                    "Leader by control plane",
                    [("llmgw_leader", "{{instance}}")],
                    description="1 while the control plane leads.",
                ),
                Panel("Nodes connected by control plane", [("llmgw_nodes_connected", "{{instance}}")]),
                Panel("Replicas by state", [("sum by (state) (llmgw_replicas)", "{{state}}")], stack=True),
                Panel(
                    "Engine restarts (agents)",
                    [
                        (
                            f"sum by (instance, engine) "
                            f"(increase(llmgw_agent_engine_restarts_total[{RATE}]))",
                            "{{instance}} {{engine}}",
                        ),
                    ],
                    description="Engines started again after they exited, crashed or stopped answering.",
                ),
                Panel(
                    "Reconcile pass duration",
                    [
                        (
                            quantile(0.5, "llmgw_reconcile_duration_seconds"),
                            "p50",
                        ),
                        (
                            quantile(0.99, "llmgw_reconcile_duration_seconds"),
                            "p99",
                        ),
                    ],
                    unit="s",
                ),
            ],
        ),
        Row(
            "Store",
            [
                Panel(
                    "Store statement latency",
                    [
                        (
                            quantile(0.5, "llmgw_store_query_duration_seconds"),
                            "p50",
                        ),
                        (
                            quantile(0.99, "llmgw_store_query_duration_seconds"),
                            "p99",
                        ),
                    ],
                    unit="s",
                ),
                Panel(
                    "Store errors",
                    [(f"sum by (instance) (rate(llmgw_store_errors_total[{RATE}]))", "{{instance}}")],
                    unit="ops",
                    description="Statements the store failed: connection lost, timeout, conflict.",
                ),
            ],
        ),
        Row(
            "Traffic",
            [
                Panel(
                    "Requests by status",
                    [(f"sum by (code) (rate(llmgw_gateway_requests_total[{RATE}]))", "{{code}}")],
                    unit="reqps",
                    stack=True,
                ),
                Panel(
                    "Tokens",
                    [
                        (f"sum(rate(llmgw_gateway_prompt_tokens_total[{RATE}]))", "prompt"),
                        (f"sum(rate(llmgw_gateway_completion_tokens_total[{RATE}]))", "completion"),
                    ],
                    unit="short",
                    description="Tokens per second engines counted in answered requests.",
                ),
            ],
        ),
    ],
)

GPUS = Dashboard(
    uid="llmgw-gpus",
    title="llmgw / GPUs",
    description="A row per GPU device (card or MIG instance) from the telemetry agents send.",
    variables=[
        ("node", "label_values(llmgw_gpu_memory_total_bytes, node)"),
        ("device", 'label_values(llmgw_gpu_memory_total_bytes{node=~"$node"}, device)'),
    ],
    rows=[
        Row(
            "Fleet",
            [
                Panel(
                    "Utilisation by device",
                    [(f"max by (node, device) (llmgw_gpu_utilization_ratio{G})", "{{node}}/{{device}}")],
                    unit="percentunit",
                ),
                Panel(
                    "Memory in use by device",
                    [(f"max by (node, device) (llmgw_gpu_memory_used_bytes{G})", "{{node}}/{{device}}")],
                    unit="bytes",
                ),
                Panel(
                    "Xid events",
                    [
                        (
                            f"sum by (node, card, xid) (increase(llmgw_gpu_xid_events_total{N}[{RATE}]))",
                            "{{node}} card {{card}} xid {{xid}}",
                        )
                    ],
                    description="Xid lines the kernel logged; 48, 63, 64, 74, 79 call for a look at once.",
                ),
                Panel(
                    "NVLink errors",
                    [
                        (
                            f"sum by (node, card, link) (increase(llmgw_gpu_nvlink_errors_total{N}[{RATE}]))",
                            "{{node}} card {{card}} link {{link}}",
                        )
                    ],
                ),
            ],
        ),
        Row(
            "$node / $device",
            repeat="device",
            panels=[
                Panel(
                    "Utilisation",
                    [
                        (f"max(llmgw_gpu_utilization_ratio{G})", "compute"),
                        (f"max(llmgw_gpu_memory_bandwidth_ratio{G})", "memory bandwidth"),
                    ],
                    unit="percentunit",
                    width=8,
                    description="Left out on MIG instances, which do not report it.",
                ),
                Panel(
                    "Memory",
                    [
                        (f"max(llmgw_gpu_memory_used_bytes{G})", "used"),
                        (f"max(llmgw_gpu_memory_total_bytes{G})", "total"),
                        (f"max(llmgw_gpu_foreign_memory_bytes{G})", "held by other processes"),
                    ],
                    unit="bytes",
                    width=8,
                ),
                Panel(
                    "Temperature",
                    [(f"max(llmgw_gpu_temperature_celsius{G})", "temperature")],
                    unit="celsius",
                    width=8,
                ),
                Panel("Power", [(f"max(llmgw_gpu_power_watts{G})", "power")], unit="watt", width=8),
                Panel("SM clock", [(f"max(llmgw_gpu_sm_clock_hertz{G})", "SM clock")], unit="hertz", width=8),
                Panel(
                    "Uncorrected ECC errors",
                    [(f"max(llmgw_gpu_ecc_uncorrected_errors_total{G})", "since driver load")],
                    width=8,
                    description="Any at all: drain the card and have it looked at.",
                ),
            ],
        ),
    ],
)

MODELS = Dashboard(
    uid="llmgw-models",
    title="llmgw / Models",
    description="Per model: traffic, time to first token, time between tokens, errors and queue.",
    variables=[("model", "label_values(llmgw_gateway_requests_total, model)")],
    rows=[
        Row(
            "Traffic",
            [
                Panel(
                    "Requests by model",
                    [(f"sum by (model) (rate(llmgw_gateway_requests_total{M}[{RATE}]))", "{{model}}")],
                    unit="reqps",
                    stack=True,
                ),
                Panel(
                    "Generated tokens by model",
                    [
                        (
                            f"sum by (model) (rate(llmgw_gateway_completion_tokens_total{M}[{RATE}]))",
                            "{{model}}",
                        )
                    ],
                    unit="short",
                    stack=True,
                ),
                Panel(
                    "Requests by project",
                    [(f"sum by (project) (rate(llmgw_gateway_requests_total{M}[{RATE}]))", "{{project}}")],
                    unit="reqps",
                    stack=True,
                ),
                Panel(
                    "Request duration p50 / p99",
                    [
                        (
                            quantile(0.5, "llmgw_gateway_request_duration_seconds", M, by="model"),
                            "{{model}} p50",
                        ),
                        (
                            quantile(0.99, "llmgw_gateway_request_duration_seconds", M, by="model"),
                            "{{model}} p99",
                        ),
                    ],
                    unit="s",
                ),
            ],
        ),
        Row(
            "Latency of streams",
            [
                Panel(
                    "Time to first token",
                    [
                        (
                            quantile(0.5, "llmgw_gateway_time_to_first_token_seconds", M, by="model"),
                            "{{model}} p50",
                        ),
                        (
                            quantile(0.95, "llmgw_gateway_time_to_first_token_seconds", M, by="model"),
                            "{{model}} p95",
                        ),
                    ],
                    unit="s",
                ),
                Panel(
                    "Time between tokens",
                    [
                        (
                            quantile(0.5, "llmgw_gateway_time_between_tokens_seconds", M, by="model"),
                            "{{model}} p50",
                        ),
                        (
                            quantile(0.95, "llmgw_gateway_time_between_tokens_seconds", M, by="model"),
                            "{{model}} p95",
                        ),
                    ],
                    unit="s",
                ),
            ],
        ),
        Row(
            "Errors",
            [
                Panel(
                    "Server error ratio",
                    [
                        (
                            zero_when_none(
                                f"sum by (model) (rate(llmgw_gateway_requests_total{M5}[{RATE}]))",
                                f"sum by (model) (rate(llmgw_gateway_requests_total{M}[{RATE}]))",
                            ),
                            "{{model}}",
                        )
                    ],
                    unit="percentunit",
                    description="Answers 5xx among all answers.",
                ),
                Panel(
                    "Upstream failures",
                    [
                        (
                            f"sum by (model, reason) "
                            f"(rate(llmgw_gateway_upstream_failures_total{M}[{RATE}]))",
                            "{{model}} {{reason}}",
                        )
                    ],
                    unit="ops",
                    description="Replicas the gateway could not reach (unreachable) or that failed "
                    "mid-answer (dropped).",
                ),
            ],
        ),
        Row(
            "Queue and replicas",
            [
                Panel(
                    "Requests in flight",
                    [("sum by (instance) (llmgw_gateway_requests_in_flight)", "{{instance}}")],
                    description="Requests being answered now, over every model (waiting for a replica or "
                    "on one).",
                ),
                Panel(
                    "Replicas by state",
                    [(f"sum by (model, state) (llmgw_replicas{M})", "{{model}} {{state}}")],
                    stack=True,
                ),
            ],
        ),
    ],
)

ROUTING = Dashboard(
    uid="llmgw-routing",
    title="llmgw / Routing",
    description="How the router chose replicas (KV blocks held, prefix tree, load) and LoRA adapters moving.",
    rows=[
        Row(
            "Decisions",
            [
                Panel(
                    "Decisions by kind",
                    [(f"sum by (kind) (rate(llmgw_prefix_decisions_total[{RATE}]))", "{{kind}}")],
                    unit="ops",
                    stack=True,
                    description="kv: blocks held; tree: approximate prefix; none: no replica held the "
                    "prompt's start; "
                    "saturated: the best-placed replica was saturated; load: a policy without affinity.",
                ),
                Panel(
                    "Share decided by affinity",
                    [
                        (
                            zero_when_none(
                                f'sum(rate(llmgw_prefix_decisions_total{{kind=~"kv|tree"}}[{RATE}]))',
                                f"sum(rate(llmgw_prefix_decisions_total[{RATE}]))",
                            ),
                            "kv or tree",
                        )
                    ],
                    unit="percentunit",
                ),
                Panel(
                    "Decision time",
                    [
                        (
                            quantile(0.5, "llmgw_routing_decision_seconds"),
                            "p50",
                        ),
                        (
                            quantile(0.99, "llmgw_routing_decision_seconds"),
                            "p99",
                        ),
                    ],
                    unit="s",
                ),
                Panel(
                    "Router's indexes",
                    [
                        ("sum by (instance) (llmgw_kv_index_blocks)", "KV blocks {{instance}}"),
                        ("sum by (instance) (llmgw_prefix_tree_nodes)", "tree nodes {{instance}}"),
                    ],
                ),
            ],
        ),
        Row(
            "Adapters and KV events",
            [
                Panel(
                    "Adapter loads and unloads",
                    [
                        (f"sum by (model) (rate(llmgw_adapter_loads_total[{RATE}]))", "loads {{model}}"),
                        (f"sum by (model) (rate(llmgw_adapter_unloads_total[{RATE}]))", "unloads {{model}}"),
                    ],
                    unit="ops",
                    description="Unloads that keep pace with loads: too many adapters for the slots.",
                ),
                Panel(
                    "KV event gaps",
                    [
                        (
                            f"sum by (instance) (rate(llmgw_agent_kv_event_gaps_replayed_total[{RATE}]))",
                            "replayed {{instance}}",
                        ),
                        (
                            f"sum by (instance) (rate(llmgw_agent_kv_event_resets_total[{RATE}]))",
                            "reset {{instance}}",
                        ),
                    ],
                    unit="ops",
                    description="From the agents: gaps filled from an engine's replay buffer, and resets.",
                ),
            ],
        ),
        Row(
            "Flow control (gateway.flow.mode: fair)",
            [
                Panel(
                    "Requests waiting in the gateway",
                    [("sum by (model) (llmgw_gateway_queue_depth)", "{{model}}")],
                    description="Requests queued for a slot of a busy model, by priority and fair share.",
                ),
                Panel(
                    "Waiting by project",
                    [("sum by (model, flow) (llmgw_gateway_queue_depth)", "{{model}} {{flow}}")],
                    description="Who waits: each flow (the key's project or user, or the key) per model.",
                ),
                Panel(
                    "Queue wait and refusals",
                    [
                        (quantile(0.5, "llmgw_gateway_queue_wait_seconds"), "wait p50"),
                        (quantile(0.99, "llmgw_gateway_queue_wait_seconds"), "wait p99"),
                        (
                            f"sum by (reason) (rate(llmgw_gateway_queue_refused_total[{RATE}]))",
                            "refused {{reason}} /s",
                        ),
                    ],
                    description="Waits of the requests sent on; 429s: queue_full, queue_shed, queue_timeout.",
                ),
            ],
        ),
    ],
)

DASHBOARDS = [CLUSTER, GPUS, MODELS, ROUTING]


def rendered() -> dict[str, str]:
    """File name → JSON text of every dashboard."""
    return {f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2) + "\n" for d in DASHBOARDS}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in rendered().items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
