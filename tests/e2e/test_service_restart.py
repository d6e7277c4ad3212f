"""The agent's unit restart, as systemd does it with KillMode=process: SIGTERM to the agent alone (C10.1).

The agent runs as ``llmgw-agent.service`` runs it (``--keep-engines``); the
test sends the main process SIGTERM, as ``systemctl restart`` does, and starts
it again: the engine serving before is the one serving after.
"""

from __future__ import annotations

import os
import signal

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, engine_pid

pytestmark = pytest.mark.e2e


def _answers(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=60)  # type: ignore[attr-defined]
    answer = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert answer.choices[0].message.content


def _start_as_the_unit_does(cluster: Cluster) -> None:
    config = cluster.home / "nodes" / "node1" / "agent.yaml"
    cluster.start("agent-node1", "agent", "run", "--config", str(config), "--keep-engines")


def test_engines_outlive_a_sigterm_to_an_agent_that_keeps_them(cluster: Cluster) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    cluster.kill("agent-node1", signal.SIGKILL)  # the fixture's agent, started without the unit's flag
    _start_as_the_unit_does(cluster)
    cluster.wait_ready(DEFAULT_MODEL, 60)
    assert engine_pid(before["port"]) == pid

    cluster.kill("agent-node1", signal.SIGTERM)  # 'systemctl restart llmgw-agent', KillMode=process
    os.kill(pid, 0)  # still running: raises ProcessLookupError otherwise
    assert engine_pid(before["port"]) == pid
    _start_as_the_unit_does(cluster)
    after = cluster.wait_ready(DEFAULT_MODEL, 60)
    assert engine_pid(after["port"]) == pid
    assert after["restarts"] == before["restarts"]
    _answers(cluster)
