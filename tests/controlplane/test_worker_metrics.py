"""/metrics behind gateway workers: each worker's gateway samples added to the control plane's own."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.admin.metricsaccess import metrics_refusal
from llmgw.controlplane.metrics.workermetrics import (
    SummedRegistry,
    gateway_samples,
    metrics_only,
    serve_metrics,
)


def registry() -> tuple[CollectorRegistry, Counter, Histogram]:
    reg = CollectorRegistry()
    requests = Counter("llmgw_gateway_requests", "r", ["model"], registry=reg)
    duration = Histogram("llmgw_gateway_duration_seconds", "d", buckets=(0.1, 1.0), registry=reg)
    Gauge("llmgw_nodes_connected", "n", registry=reg).set(1)
    return reg, requests, duration


def values(view: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(view).decode()  # type: ignore[arg-type]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_workers_samples_are_added_to_the_same_names_and_labels_and_new_ones_appear() -> None:
    main, main_requests, main_duration = registry()
    main_requests.labels("m").inc(2)
    main_duration.observe(0.05)
    worker, worker_requests, worker_duration = registry()
    worker_requests.labels("m").inc(3)
    worker_requests.labels("other").inc(1)  # a label the control plane never saw
    worker_duration.observe(0.5)
    samples = gateway_samples(worker)
    assert not any(name.startswith("llmgw_nodes") or name.endswith("_created") for name, _, _ in samples)
    summed = values(SummedRegistry(main, lambda: [samples, samples]))  # two workers alike
    assert summed[("llmgw_gateway_requests_total", (("model", "m"),))] == 2 + 3 + 3
    assert summed[("llmgw_gateway_requests_total", (("model", "other"),))] == 2
    assert summed[("llmgw_gateway_duration_seconds_count", ())] == 3
    assert summed[("llmgw_gateway_duration_seconds_bucket", (("le", "0.1"),))] == 1
    assert summed[("llmgw_gateway_duration_seconds_bucket", (("le", "1.0"),))] == 3
    assert summed[("llmgw_nodes_connected", ())] == 1  # the control plane's own stay as they are
    assert values(SummedRegistry(main, list)) == values(main)


async def get(app: Any, path: str, token: str = "") -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp") as client:
        return await client.get(path, headers=headers)


async def behind(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_metrics_behind_workers_wants_the_same_token_as_without_them() -> None:
    main, requests, _ = registry()
    requests.labels("acme-private").inc()
    refreshed: list[bool] = []

    async def refresh() -> None:
        refreshed.append(True)

    callers = Callers(hashlib.sha256(b"llmgw-admin-x").hexdigest())
    app = serve_metrics(
        behind, SummedRegistry(main, list), refresh, lambda auth: metrics_refusal(callers, auth)
    )
    refused = await get(app, "/metrics")
    assert refused.status_code == 401 and "acme-private" not in refused.text
    assert refused.json()["error"]["message"] == "missing, wrong, expired or revoked token"
    assert refreshed == []  # the workers are not asked for a refused scrape
    answered = await get(app, "/metrics", "llmgw-admin-x")
    assert answered.status_code == 200 and 'model="acme-private"' in answered.text
    assert (await get(app, "/api/models")).status_code == 204  # the rest goes on behind


async def test_metrics_only_serves_metrics_without_a_token_and_nothing_else() -> None:
    main, requests, _ = registry()
    requests.labels("m").inc()
    app = metrics_only(main)
    answered = await get(app, "/metrics")
    assert answered.status_code == 200 and 'llmgw_gateway_requests_total{model="m"} 1.0' in answered.text
    missing = await get(app, "/api/models", "llmgw-admin-x")
    assert missing.status_code == 404 and "serves /metrics alone" in missing.json()["error"]["hint"]
