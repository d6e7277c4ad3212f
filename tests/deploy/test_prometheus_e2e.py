"""A real Prometheus scraping a running cluster: every dashboard panel's query returns data.

The cluster is a control plane, an agent serving SmolLM2 on the CPU and a GPU
node whose nvidia-smi is the stand-in (a process not llmgw's holding memory on
one card); a few chat requests (streamed and not)
give the gateway's metrics something to count. Prometheus loads llmgw's rules
too, so the SLO recording rules are evaluated against real series.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from llmgw.cli.up import DEFAULT_MODEL, bundled_model
from llmgw.engines import builds
from llmgw.testing.cluster import Cluster, free_port, wait_for
from llmgw.testing.nvidia_smi_standin import A100_80G_MIG, H100_80G, FakeProcess, install_fake_nvidia_smi

from .conftest import RULES
from .test_dashboards import DASHBOARDS, panel_queries

pytestmark = pytest.mark.e2e

CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser()
RATE_WINDOW = "30s"
EVENT_METRICS = {
    # Counters whose series appear with their first event (an Xid, a failure, a load):
    # in a healthy cluster their panels have no data, but Prometheus must know the metric.
    "llmgw_gpu_xid_events_total",
    "llmgw_gpu_nvlink_errors_total",
    "llmgw_gateway_upstream_failures_total",
    "llmgw_adapter_loads_total",
    "llmgw_adapter_unloads_total",
    "llmgw_store_errors_total",
    "llmgw_agent_engine_restarts_total",
    "llmgw_agent_kv_event_gaps_replayed_total",
    "llmgw_agent_kv_event_resets_total",
    # the gateway's flow queue: series once a busy model queues (gateway.flow.mode: fair)
    "llmgw_gateway_queue_depth",
    "llmgw_gateway_queue_wait_seconds",
    "llmgw_gateway_queue_refused_total",
}


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)["result"]  # type: ignore[no-any-return]

    def known_metrics(self) -> set[str]:
        """Metric names with series, or whose HELP/TYPE a scrape carried."""
        return set(self.get("/api/v1/label/__name__/values")) | set(self.get("/api/v1/metadata"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = bundled_model()
    if model is None or not builds.installed(CACHE):
        pytest.fail("SmolLM2 or the llama.cpp build is missing: run 'make engine'")
    home = tmp_path_factory.mktemp("cluster")
    with Cluster(home, CACHE) as running:
        running.start_server()
        running.add_model(DEFAULT_MODEL, model, {"ctx_size": 2048, "parallel": 2})
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(DEFAULT_MODEL, 180)
        someone_elses = replace(H100_80G, processes=(FakeProcess(4242, "python3", 2048),))
        smi = install_fake_nvidia_smi(home / "bin", [someone_elses, A100_80G_MIG])
        running.add_node("gpu1", nvidia_smi=str(smi))
        running.start_agent("gpu1")
        yield running


def agent_targets(cluster: Cluster) -> list[str]:
    """The agents' /metrics addresses, as their agent.yaml says (none where agents serve none)."""
    targets = []
    for path in sorted(cluster.home.glob("nodes/*/agent.yaml")):
        metrics = yaml.safe_load(path.read_text()).get("metrics") or {}
        if metrics.get("port"):
            targets.append(f"{metrics.get('host', '127.0.0.1')}:{metrics['port']}")
    return targets


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    from .conftest import tool

    binary = tool("prometheus", "run 'make prometheus' (apt-get install prometheus)")
    directory = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    scrape: list[dict[str, Any]] = [
        {  # the control plane's /metrics wants the admin token; Prometheus reads it from its file
            "job_name": "llmgw",
            "authorization": {"credentials_file": str(cluster.home / "admin.token")},
            "static_configs": [{"targets": [f"127.0.0.1:{cluster.http_port}"]}],
        }
    ]
    if agent_targets(cluster):
        scrape.append({"job_name": "llmgw-agent", "static_configs": [{"targets": agent_targets(cluster)}]})
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in RULES],
        "scrape_configs": scrape,
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    with (directory / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        server = Prometheus(f"http://127.0.0.1:{port}")
        wait_for(lambda: server.get("/api/v1/status/buildinfo"), 30, "Prometheus answers")
        yield server
    finally:
        process.terminate()
        process.wait(30)


def send_requests(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=60)
    for i in range(3):
        client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": f"Say hello {i}."}], max_tokens=8
        )
        stream = client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=12,
            stream=True,
        )
        assert [chunk for chunk in stream]


def as_prometheus_sees_it(expr: str) -> str:
    for name in ("model", "node", "device"):
        expr = expr.replace(f"${name}", ".*")
    return expr.replace("$__rate_interval", RATE_WINDOW)


def test_every_dashboard_panel_returns_data(cluster: Cluster, prometheus: Prometheus) -> None:
    send_requests(cluster)
    wait_for(
        lambda: prometheus.query('count_over_time(up{job="llmgw"}[1m]) >= 10') or None,
        60,
        "Prometheus has scraped the control plane ten times",
    )
    wait_for(
        lambda: prometheus.query("llmgw_gpu_temperature_celsius") or None,
        60,
        "the GPU node's telemetry reached the control plane",
    )
    send_requests(cluster)
    known = prometheus.known_metrics()
    empty: list[str] = []
    unknown: set[str] = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        for title, expr in panel_queries(json.loads(path.read_text())):
            query = as_prometheus_sees_it(expr)
            if prometheus.query(query):
                continue
            named = set(re.findall(r"\bllmgw_[a-z0-9_]+", expr))
            families = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in named}
            missing = {f for f in families if f not in known and f"{f}_bucket" not in known}
            unknown |= missing
            if missing or not families <= EVENT_METRICS:
                empty.append(
                    f"{path.name} / {title}: {query}" + (f" (unknown: {sorted(missing)})" if missing else "")
                )
    assert not empty, f"metrics unknown to Prometheus: {sorted(unknown)}\npanels without data:\n" + "\n".join(
        empty
    )


def test_slo_recording_rules_evaluate_on_real_series(cluster: Cluster, prometheus: Prometheus) -> None:
    send_requests(cluster)

    def recorded() -> list[dict[str, Any]] | None:
        """The ratio once two scrapes saw the requests (before that, 0/0 is NaN)."""
        series = prometheus.query("llmgw:gateway_errors:ratio_rate5m")
        return [s for s in series if s["value"][1] != "NaN"] or None

    (sample,) = wait_for(recorded, 60, "the error ratio is recorded for the served model")
    assert sample["metric"]["model"] == DEFAULT_MODEL and float(sample["value"][1]) == 0.0
    ttft = wait_for(
        lambda: (
            [s for s in prometheus.query("llmgw:gateway_ttft_slow:ratio_rate5m") if s["value"][1] != "NaN"]
            or None
        ),
        60,
        "the share of slow first tokens is recorded (needs the 2.5 s bucket of the TTFT histogram)",
    )
    assert 0.0 <= float(ttft[0]["value"][1]) <= 1.0


def test_rules_load_and_no_alert_is_pending_on_a_healthy_cluster(prometheus: Prometheus) -> None:
    groups = prometheus.get("/api/v1/rules")["groups"]
    assert {g["file"] for g in groups} == {str(p) for p in RULES}
    assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
    alerts = prometheus.get("/api/v1/alerts")["alerts"]
    assert [(a["labels"]["alertname"], a["state"]) for a in alerts] == []
