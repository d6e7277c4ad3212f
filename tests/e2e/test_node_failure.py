"""A whole node that dies: its replicas go to another node once its grace ends (C5.3).

Two agents on this machine are two nodes; killing one node kills its agent
(SIGKILL) and its engines (found by their shards' state files, as the
engines run in sessions of their own). The control plane here gives a node
``GRACE_S`` (``reconcile.node_grace_s``) instead of the default 15 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.shardstates import is_engine, read_state
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.controlplane.config import save_server_config
from llmgw.errors import LlmgwError
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.traffic import Traffic

pytestmark = pytest.mark.e2e

GRACE_S = 5.0
RECOVERY_GOAL_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path, engine_cache: Path) -> Iterator[Cluster]:
    """A control plane with a short node grace, and an API key; no node yet."""
    running = Cluster(tmp_path / "cluster", engine_cache)
    running.config.reconcile.node_grace_s = GRACE_S
    save_server_config(running.config, running.home / "server.yaml")
    with running:
        running.start_server()
        running.create_key()
        yield running


def add_model(cluster: Cluster, weights: Path, replicas: int) -> None:
    blob = cluster.upload(weights)
    cluster.admin.request(
        "POST",
        "/api/models",
        {
            "name": DEFAULT_MODEL,
            "source": {"sha256": blob["sha256"], "filename": weights.name},
            "profile": {"ctx_size": 2048, "parallel": 2},
            "replicas": {"min": replicas, "max": replicas},
        },
    )


def ready(cluster: Cluster) -> list[dict[str, Any]]:
    return [r for r in cluster.replicas(DEFAULT_MODEL) if r["state"] == "ready"]


def wait_nodes(cluster: Cluster, *node_ids: str) -> None:
    wait_for(
        lambda: {n["id"] for n in cluster.admin.get("/api/nodes") if n["connected"]} >= set(node_ids),
        60,
        f"nodes {', '.join(node_ids)} connect",
    )


def kill_node(cluster: Cluster, node_id: str) -> int:
    """Kill the node's agent, then every engine its shards' state files name; how many engines."""
    cluster.kill(f"agent-{node_id}", signal.SIGKILL)
    killed = 0
    for directory in cluster.home.glob(f"nodes/{node_id}/work/shards/*"):
        with contextlib.suppress(LlmgwError, ProcessLookupError):
            record = read_state(directory)
            if is_engine(record):
                os.kill(record.pid, signal.SIGKILL)
                killed += 1
    return killed


def test_the_replica_of_a_dead_node_is_served_from_another_node_within_the_grace_and_a_start(
    cluster: Cluster, model_file: Path
) -> None:
    add_model(cluster, model_file, replicas=1)
    cluster.start_agent("node1")
    before = cluster.wait_ready(DEFAULT_MODEL, 180)
    assert before["node"] == "node1"
    cluster.start_agent("node2")
    wait_nodes(cluster, "node1", "node2")
    traffic = Traffic(cluster.url, cluster.key, DEFAULT_MODEL, timeout_s=60, max_s=120).start()
    try:
        wait_for(lambda: any(o.ok for o in traffic.outcomes), 30, "the traffic is served")
        assert kill_node(cluster, "node1") == 1
        killed_at = time.monotonic()
        recovered = wait_for(
            lambda: traffic.recovered_after(killed_at), GRACE_S + 60, "requests succeed again"
        )
    finally:
        outcomes = traffic.stop()

    (after,) = ready(cluster)
    failed = traffic.failed_after(killed_at)
    print(
        f"\nnode death, one replica: node_grace_s={GRACE_S:g}; requests succeed again "
        f"{recovered:.1f} s after the kill; {len(failed)} of "
        f"{sum(1 for o in outcomes if o.started >= killed_at)} requests sent after it failed "
        f"({sorted({o.status for o in failed})})"
    )
    assert after["node"] == "node2" and after["id"] != before["id"]
    assert recovered < RECOVERY_GOAL_S, f"took {recovered:.1f} s; goal: under {RECOVERY_GOAL_S:g} s"
    assert {r["id"] for r in cluster.replicas(DEFAULT_MODEL)} == {after["id"]}

    cluster.start_agent("node1")  # the node comes back and starts its shard again: a stray, stopped
    wait_nodes(cluster, "node1")
    stray = cluster.home / "nodes" / "node1" / "work" / "shards" / before["id"]
    wait_for(lambda: not stray.exists(), 30, "node1 stops the replica moved off it")
    assert {r["id"] for r in cluster.replicas(DEFAULT_MODEL)} == {after["id"]}


def test_a_model_on_two_nodes_fails_only_the_requests_in_flight_on_the_dead_one(
    cluster: Cluster, model_file: Path
) -> None:
    cluster.start_agent("node1")
    cluster.start_agent("node2")
    wait_nodes(cluster, "node1", "node2")
    add_model(cluster, model_file, replicas=2)
    wait_for(lambda: len(ready(cluster)) == 2, 180, "two replicas are ready")
    assert {r["node"] for r in ready(cluster)} == {"node1", "node2"}
    traffic = Traffic(cluster.url, cluster.key, DEFAULT_MODEL, pause_s=0.05, timeout_s=60, max_s=120)
    traffic.start()
    try:
        wait_for(lambda: sum(o.ok for o in traffic.outcomes) >= 5, 30, "the traffic is served")
        kill_node(cluster, "node1")
        killed_at = time.monotonic()
        replaced = wait_for(
            lambda: len(ready(cluster)) == 2 and all(r["node"] == "node2" for r in ready(cluster)),
            GRACE_S + 60,
            "the dead node's replica is replaced on node2",
        )
        replaced_at = time.monotonic()
        wait_for(
            lambda: sum(o.started >= replaced_at for o in traffic.outcomes) >= 3,
            60,
            "requests served once both replicas are on node2",
        )
    finally:
        outcomes = traffic.stop()

    in_flight = [o for o in outcomes if o.started < killed_at < o.ended]
    after = [o for o in outcomes if o.started >= killed_at]
    failed = [o for o in after if not o.ok]
    print(
        f"\nnode death, two replicas: node_grace_s={GRACE_S:g}; {len(after)} requests sent after the kill, "
        f"{len(failed)} failed; {len(in_flight)} in flight at the kill, "
        f"{sum(not o.ok for o in in_flight)} failed; "
        f"replaced on node2 {replaced_at - killed_at:.1f} s after the kill"
    )
    assert replaced
    assert after and not failed, [(round(o.started - killed_at, 2), o.status, o.error) for o in failed]
