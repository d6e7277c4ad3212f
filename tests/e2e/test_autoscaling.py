"""Autoscaling end to end (C5.3): a model with replicas min 1 max 2 scales to 2 under load and back
to 1 once the load stops, and the replica drained finishes its requests: none fails.

The node runs the llama-server stand-in with its streamed events spaced, so each streamed
request stays in flight about a second and six clients at once keep more requests on the
first replica than its slots.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.controlplane.config import save_server_config
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.traffic import Traffic

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
CHUNK_INTERVAL_MS = 15
"""Between the stand-in's streamed events: a stream takes about 64 x 15 ms, one second."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path / "cluster", tmp_path / "cache")
    running.config.reconcile.interval_s = 0.5
    save_server_config(running.config, running.home / "server.yaml")
    with running:
        running.start_server()
        weights = tmp_path / "weights.gguf"
        weights.write_bytes(b"GGUF stand-in\n")
        blob = running.upload(weights)
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": MODEL,
                "source": {"sha256": blob["sha256"], "filename": weights.name},
                "profile": {"ctx_size": 2048, "parallel": 2},
                "replicas": {
                    "min": 1, "max": 2, "scale_up_cooldown_s": 0, "scale_down_cooldown_s": 3,
                    "drain_timeout_s": 30,
                },
            },
        )  # fmt: skip
        running.create_key("tests")
        launcher = write_launcher(tmp_path / "bin" / "llama-server", chunk_interval_ms=CHUNK_INTERVAL_MS)
        running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("node1")
        running.wait_ready(MODEL, 60)
        yield running


def test_load_scales_to_two_and_the_calm_drains_back_to_one_without_a_failed_request(
    cluster: Cluster,
) -> None:
    def clients(count: int) -> list[Traffic]:
        return [
            Traffic(cluster.url, cluster.key, MODEL, pause_s=0.0, stream=True, max_s=120).start()
            for _ in range(count)
        ]

    steady = clients(1)  # runs throughout: the drain must not fail it
    burst = clients(5)
    try:
        wait_for(
            lambda: len([r for r in cluster.replicas(MODEL) if r["state"] == "ready"]) == 2 or None,
            60,
            "a second replica serves under the load",
        )
        ids = {r["id"] for r in cluster.replicas(MODEL)}
    finally:
        outcomes = [o for traffic in burst for o in traffic.stop()]
    wait_for(lambda: len(cluster.replicas(MODEL)) == 1 or None, 60, "the calm drains one replica away")
    (left,) = cluster.replicas(MODEL)
    assert left["id"] in ids
    outcomes += steady[0].stop()
    failed = [o for o in outcomes if not o.ok]
    assert not failed, failed[:3]
    assert len(outcomes) > 10
    log = cluster.log("server").read_text()
    assert "scaling standin-chat: up from 1 to 2" in log
    assert "scaling standin-chat: down from 2 to 1" in log
    assert "(drained)" in log
