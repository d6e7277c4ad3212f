"""Agent restarts: engines outlive the agent and the next one adopts them (C2.2, C2.3)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from llmgw.cli import ctl
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.errors import NotFound
from llmgw.testing.cluster import Cluster, engine_pid, wait_for

pytestmark = pytest.mark.e2e


def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=60)  # type: ignore[attr-defined]


def _shards(cluster: Cluster) -> Path:
    return cluster.home / "nodes" / "node1" / "work" / "shards"


def _answers(cluster: Cluster) -> None:
    answer = client(cluster).chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert answer.choices[0].message.content


def _restart_agent(cluster: Cluster) -> None:
    cluster.start_agent("node1")
    cluster.wait_ready(DEFAULT_MODEL, 60)


def test_a_stream_completes_across_a_killed_agent_and_the_engine_is_adopted(cluster: Cluster) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    stream = client(cluster).chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Tell a long story about a lighthouse."}],
        max_tokens=200,
        stream=True,
    )
    chunks = iter(stream)
    first = next(chunks)
    cluster.kill("agent-node1", signal.SIGKILL)
    rest = list(chunks)
    assert first.choices and rest, "the stream ended early"
    assert rest[-1].choices == [] or rest[-1].choices[0].finish_reason is not None
    wait_for(
        lambda: all(r["state"] != "ready" for r in cluster.replicas(DEFAULT_MODEL)),
        30,
        "the control plane saw the node go",
    )
    _restart_agent(cluster)
    after = cluster.replicas(DEFAULT_MODEL)[0]
    assert engine_pid(after["port"]) == pid
    assert after["restarts"] == before["restarts"]
    assert after["port"] == before["port"]
    _answers(cluster)


def test_an_adopted_engine_keeps_its_output_from_before_the_restart(cluster: Cluster) -> None:
    replica = cluster.wait_ready(DEFAULT_MODEL)
    directory = _shards(cluster) / replica["id"]
    outputs = list(directory.glob("output-*.log"))
    assert len(outputs) == 1
    assert outputs[0].stat().st_mode & 0o777 == 0o600
    logs = cluster.admin.request("GET", f"/api/replicas/{replica['id']}/logs?lines=5000")
    assert any("llama" in line or "server" in line for line in logs["lines"][:20])
    assert any("listening" in line for line in logs["lines"])


def test_a_corrupt_state_file_leaves_that_shard_stopped_and_the_agent_serving(cluster: Cluster) -> None:
    cluster.wait_ready(DEFAULT_MODEL)
    cluster.kill("agent-node1", signal.SIGKILL)
    broken = _shards(cluster) / "r-broken"
    broken.mkdir(parents=True)
    (broken / "state.json").write_text('{"format": 1, "spec": "not base64!')
    _restart_agent(cluster)
    log = cluster.log("agent-node1")
    wait_for(lambda: "shard r-broken left stopped" in log.read_text(), 30, "the agent reported the shard")
    assert cluster.processes["agent-node1"].poll() is None
    _answers(cluster)


def test_ctl_logs_follows_new_engine_lines(cluster: Cluster) -> None:
    replica = cluster.wait_ready(DEFAULT_MODEL)
    seen: list[str] = []

    def follow() -> None:
        for line in cluster.admin.stream(f"/api/replicas/{replica['id']}/logs?lines=0&follow=true"):
            seen.append(line)

    threading.Thread(target=follow, daemon=True).start()
    wait_for(lambda: _answers(cluster) or any("slot" in line for line in seen), 30, "a new line followed")


def test_ctl_logs_prints_the_last_lines_and_names_an_unknown_replica(cluster: Cluster) -> None:
    replica = cluster.wait_ready(DEFAULT_MODEL)
    options = ["--url", cluster.url, "--token", cluster.admin.token]
    shown = CliRunner().invoke(ctl.app, ["logs", replica["id"], "-n", "3", *options])
    assert shown.exit_code == 0, shown.output
    assert 1 <= len(shown.output.strip().splitlines()) <= 3
    with pytest.raises(NotFound) as caught:
        cluster.admin.get("/api/replicas/r-none/logs")
    assert "llmgw ctl replicas" in caught.value.hint
