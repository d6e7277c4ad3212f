"""The committed dashboards are what generate.py makes, and every panel's query is valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .conftest import DEPLOY, dashboards_module

DASHBOARDS = DEPLOY / "grafana" / "dashboards"


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def as_prometheus_sees_it(expr: str) -> str:
    """A panel's query with Grafana's variables given values: every label value, a 5 m rate window."""
    return re.sub(r"\$(model|node|device)\b", ".*", expr.replace("$__rate_interval", "5m"))


def all_queries() -> list[tuple[str, str, str]]:
    return [
        (path.name, title, as_prometheus_sees_it(expr))
        for path in sorted(DASHBOARDS.glob("*.json"))
        for title, expr in panel_queries(json.loads(path.read_text()))
    ]


def test_committed_dashboards_are_generated_from_their_definitions() -> None:
    made = dashboards_module().rendered()
    committed = {path.name: path.read_text() for path in DASHBOARDS.glob("*.json")}
    assert committed == made, "run: python deploy/grafana/generate.py"


def test_the_four_dashboards_cover_the_cluster_gpus_models_and_routing() -> None:
    titles = {json.loads(p.read_text())["title"] for p in DASHBOARDS.glob("*.json")}
    assert titles == {"llmgw / Cluster", "llmgw / GPUs", "llmgw / Models", "llmgw / Routing"}


def test_the_gpu_dashboard_repeats_a_row_per_device() -> None:
    gpus = json.loads((DASHBOARDS / "llmgw-gpus.json").read_text())
    repeated = [p for p in gpus["panels"] if p["type"] == "row" and p.get("repeat") == "device"]
    variables = {v["name"] for v in gpus["templating"]["list"]}
    assert len(repeated) == 1 and {"node", "device"} <= variables


def test_panels_do_not_overlap() -> None:
    for path in DASHBOARDS.glob("*.json"):
        taken: set[tuple[int, int]] = set()
        for panel in json.loads(path.read_text())["panels"]:
            box = panel["gridPos"]
            cells = {
                (x, y)
                for x in range(box["x"], box["x"] + box["w"])
                for y in range(box["y"], box["y"] + box["h"])
            }
            assert not cells & taken, f"{path.name}: {panel['title']} overlaps another panel"
            assert box["x"] + box["w"] <= 24
            taken |= cells


def test_every_panel_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule): a typo fails here, not on a dashboard."""
    queries = all_queries()
    rules = {
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"panel:query:{i}", "expr": expr} for i, (_, _, expr) in enumerate(queries)
                ],
            }
        ]
    }
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "panels.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(queries) >= 40
