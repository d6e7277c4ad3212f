"""Flow control across a plane's two gateway workers (``gateway.flow.mode: fair``, ``workers: 2``):
each worker queues the requests it received for a busy model; the plane's ``/api/status``, ``ctl
status``, ``/metrics`` and autoscaling add the workers' queues up per flow; and a key with one
request is served ahead of a flood that was queued before it.

The engine is the llama-server stand-in with two slots, its streams spaced so that each request holds a
slot about 1.3 s: the flood's twelve requests take six rounds of the two slots.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from llmgw.cli import ctl
from llmgw.controlplane.config import save_server_config
from llmgw.core.flowqueue import FlowSettings
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher

from .chromium import Console, debian_chromium

pytestmark = pytest.mark.e2e

MODEL = "standin-busy"
FLOOD = 12
CHUNK_MS = 20
"""Between the stand-in's 64 streamed events: 1.3 s a request."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("flowworkers")
    running = Cluster(home / "cluster", home / "cache")
    running.config.gateway.workers = 2
    running.config.gateway.flow = FlowSettings(mode="fair", fair_by="key", queue_timeout_s=60)
    save_server_config(running.config, running.home / "server.yaml")
    with running:
        running.start_server()
        weights = running.home / "busy.standin.gguf"
        weights.write_bytes(b"GGUF stand-in\n")
        running.add_model(MODEL, weights, {"engine": "llama.cpp", "parallel": 2})
        launcher = write_launcher(home / "bin" / "llama-server", chunk_interval_ms=CHUNK_MS)
        running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("node1")
        running.wait_ready(MODEL, 60)
        yield running


def new_key(cluster: Cluster, name: str) -> tuple[str, str]:
    made = cluster.admin.request("POST", "/api/keys", {"name": name})
    return str(made["id"]), str(made["key"])


def stream(cluster: Cluster, secret: str, done: list[tuple[str, float]], who: str) -> None:
    """One streamed chat on a connection of its own, read to its end; (who, when it ended) kept."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": who}]}
    request = urllib.request.Request(
        f"{cluster.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {secret}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=90) as answer:
        assert answer.status == 200
        assert b"[DONE]" in answer.read()
    done.append((who, time.monotonic()))


def queued(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.admin.request("GET", "/api/status")["queues"].get(MODEL, {}))


def depth_by_flow(cluster: Cluster) -> dict[str, float]:
    families = text_string_to_metric_families(cluster.metrics())
    return {
        s.labels["flow"]: s.value
        for f in families
        if f.name == "llmgw_gateway_queue_depth"
        for s in f.samples
        if s.labels.get("model") == MODEL
    }


def test_the_workers_queues_add_up_and_a_lone_key_goes_ahead_of_a_flood(cluster: Cluster) -> None:
    flood_id, flood = new_key(cluster, "flood")
    chat_id, chat = new_key(cluster, "chat")
    done: list[tuple[str, float]] = []
    threads = [
        threading.Thread(target=stream, args=(cluster, flood, done, f"flood-{n}"), daemon=True)
        for n in range(FLOOD)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: queued(cluster).get("waiting", 0) >= 4, 20, "the flood waits in the workers' queues")
    lone = threading.Thread(target=stream, args=(cluster, chat, done, "chat"), daemon=True)
    lone.start()
    seen = queued(cluster)
    assert flood_id in seen["by_flow"] and set(seen["by_flow"]) <= {flood_id, chat_id}
    assert seen["waiting"] == sum(seen["by_flow"].values())
    wait_for(lambda: depth_by_flow(cluster).get(flood_id, 0) >= 1, 10, "the workers' depth per flow")
    wait_for(
        lambda: (
            "request(s) waiting" in cluster.admin.request("GET", f"/api/plan?model={MODEL}")[0]["scaling"]
        ),
        10,
        "autoscaling reads the requests waiting in the workers' queues",
    )

    options = ["--url", cluster.url, "--token", cluster.token]
    shown = CliRunner().invoke(ctl.app, ["status", *options], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f"queue {MODEL}" in shown.stdout and f"{flood_id} " in shown.stdout

    for thread in [*threads, lone]:
        thread.join(90)
    order = [who for who, _ in sorted(done, key=lambda d: d[1])]
    assert len(order) == FLOOD + 1
    assert order.index("chat") <= FLOOD - 4, order  # FIFO would have served it last
    after = queued(cluster)
    assert after["waiting"] == 0 and after["last_wait_s"] is not None
    assert chat_id not in depth_by_flow(cluster) and flood_id not in depth_by_flow(cluster)
    assert portal_queue_row(cluster)[:2] == [MODEL, "0"]


def portal_queue_row(cluster: Cluster) -> list[str]:
    """The cells of the model's row in the portal's cluster page's queue table, in Chromium."""
    with debian_chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        console = Console(page)
        page.goto(f"{cluster.url}/")
        page.fill("#token", cluster.token)
        page.press("#token", "Enter")
        row = page.wait_for_selector(f"#queues tr:has(td:text-is('{MODEL}'))", timeout=30_000)
        assert row is not None and not console.errors, console.errors
        cells = [c.inner_text() for c in row.query_selector_all("td")]
    assert cells[3].endswith(" s"), cells  # the latest wait, kept once the queue drained
    return cells
