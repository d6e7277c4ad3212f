"""``llmgw restart`` of a whole cluster (C10.1): two control planes on PostgreSQL and one agent with
the stand-in engine, under steady /v1 traffic through both control planes.

Every process starts again, one at a time (the agent, then the standby, then the leader), and
no request fails: the agent's engine keeps serving and is adopted, and a control plane keeps
its listening socket across its restart, so clients connecting meanwhile wait instead of being
refused. A process restarts by executing its own command again (same pid): each control plane's
/healthz answers a new instance, and the agent logs its start again.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from llmgw.agent.shardstates import read_state
from llmgw.errors import LlmgwError
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.postgres import PostgresServer
from llmgw.testing.traffic import Traffic

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
LEASE_S = 6.0


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("restart-cluster")
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", home / "cache", store_url=database.url, lease_s=LEASE_S) as cluster:
            cluster.start_leader_and_standby()
            cluster.add_standin_model(MODEL)
            cluster.create_key("tests")
            launcher = write_launcher(home / "bin" / "llama-server")
            cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
            cluster.start_agent("node1")
            cluster.wait_ready(MODEL, 60)
            yield cluster


def instance(cluster: Cluster, name: str) -> str:
    with urllib.request.urlopen(f"{cluster.url_of(name)}/healthz", timeout=5) as answer:
        return str(json.load(answer)["instance"])


def engine_pids(cluster: Cluster) -> dict[str, int]:
    pids = {}
    for directory in cluster.home.glob("nodes/*/work/shards/*"):
        with contextlib.suppress(LlmgwError):
            pids[directory.name] = read_state(directory).pid
    return pids


def agent_starts(cluster: Cluster) -> int:
    return cluster.log("agent-node1").read_text(errors="replace").count("node node1:")


def test_llmgw_restart_restarts_every_process_one_at_a_time_and_no_request_fails(ha: Cluster) -> None:
    instances = {name: instance(ha, name) for name in ("cp1", "cp2")}
    pids = {name: process.pid for name, process in ha.processes.items()}
    engines = engine_pids(ha)
    assert engines, "the agent runs an engine"
    starts = agent_starts(ha)
    traffic = [
        Traffic(ha.url_of(name), ha.key, MODEL, pause_s=0.05, timeout_s=60).start() for name in ("cp1", "cp2")
    ]
    try:
        wait_for(lambda: all(len(t.outcomes) >= 5 for t in traffic), 30, "traffic flows through both")
        command = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmgw.cli.main",
                "restart",
                "--url",
                ha.url_of("cp2"),
                "--token",
                ha.token,
            ],
            capture_output=True,
            text=True,
            timeout=400,
            env={**os.environ, "COLUMNS": "200"},
            check=False,
        )
        assert command.returncode == 0, f"{command.stdout}{command.stderr}\n{ha.tails()}"
        wait_for(lambda: ha.leader() != "", 30, "a control plane leads")
        ha.wait_ready(MODEL, 30)
        for t in traffic:  # requests keep flowing after the last restart
            count = len(t.outcomes)
            wait_for(lambda t=t, count=count: len(t.outcomes) >= count + 5, 60, "traffic goes on")
    finally:
        outcomes = [o for t in traffic for o in t.stop()]
    failed = [o for o in outcomes if not o.ok]
    print(f"\nllmgw restart: {len(failed)} of {len(outcomes)} requests failed\n{command.stdout}")
    assert failed == [], f"{failed[:3]}\n{ha.tails()}"
    lines = command.stdout.splitlines()
    order = [line.split(":")[0].strip() for line in lines if line.startswith("  ")]
    assert order == ["agent node1", "control-plane cp2", "control plane cp1"], command.stdout
    assert all(instance(ha, name) != before for name, before in instances.items())
    assert agent_starts(ha) == starts + 1
    assert engine_pids(ha) == engines  # the engine kept serving and was adopted
    assert {name: process.pid for name, process in ha.processes.items()} == pids  # started again in place
    assert all(process.poll() is None for process in ha.processes.values())
