"""/metrics behind gateway workers: each worker's gateway samples added to the control plane's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.controlplane.metrics.workermetrics import SummedRegistry, gateway_samples


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
