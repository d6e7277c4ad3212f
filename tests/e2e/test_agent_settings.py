"""Agents' settings from the control plane, an edited agent.yaml and llmgw restart (C2.4, C2.6).

A real agent process starts itself again on each, and its engine serves
throughout: the same llama-server process, and requests sent while the agent
restarts succeed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
import yaml
from typer.testing import CliRunner

from llmgw.agent.config import kept_settings
from llmgw.cli import ctl
from llmgw.cli.main import app
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.errors import ValidationFailed
from llmgw.testing.cluster import Cluster, engine_pid, wait_for

pytestmark = pytest.mark.e2e


def _options(cluster: Cluster) -> list[str]:
    return ["--url", cluster.url, "--token", cluster.admin.token]


def _node(cluster: Cluster) -> Path:
    return cluster.home / "nodes" / "node1"


def _log(cluster: Cluster) -> str:
    return cluster.log("agent-node1").read_text(errors="replace")


@contextmanager
def requests_meanwhile(cluster: Cluster) -> Iterator[list[str]]:
    """Send chat requests one after another until the block ends; yields the failures."""
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=60)  # type: ignore[attr-defined]
    failures: list[str] = []
    answered: list[int] = []
    done = threading.Event()

    def send() -> None:
        while not done.is_set():
            try:
                client.chat.completions.create(
                    model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
                )
                answered.append(1)
            except openai.OpenAIError as error:
                failures.append(repr(error))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield failures
    finally:
        done.set()
        sender.join(90)
    assert answered, "no request was answered"


def restarted(cluster: Cluster, reason: str, registrations: int) -> None:
    """Wait for the agent to say it restarts for ``reason`` and to register once more."""
    wait_for(lambda: f"restarting the agent: {reason}" in _log(cluster), 30, f"the agent restarts: {reason}")
    wait_for(
        lambda: _log(cluster).count("registered with") > registrations, 60, "the restarted agent registers"
    )
    assert cluster.processes["agent-node1"].poll() is None, "the agent ended instead of restarting"


def test_a_forbidden_key_is_refused_naming_it(cluster: Cluster) -> None:
    answer = CliRunner().invoke(
        app, ["ctl", "config", "set", "agents.default", "{address: 10.0.0.9, run_as: x}", *_options(cluster)]
    )
    assert isinstance(answer.exception, ValidationFailed), answer.output
    assert [field for field, _ in answer.exception.problems] == ["agents.default.address"]
    assert "run_as" not in str(cluster.admin.get("/api/settings"))


def test_a_pushed_setting_restarts_the_agent_while_its_engine_serves(cluster: Cluster) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    registrations = _log(cluster).count("registered with")
    with requests_meanwhile(cluster) as failures:
        answer = CliRunner().invoke(
            ctl.app, ["config", "set", "agents.nodes.node1", "shards: {stop_grace_s: 7}", *_options(cluster)]
        )
        assert answer.exit_code == 0, answer.output
        restarted(cluster, "the control plane's settings changed", registrations)
        cluster.wait_ready(DEFAULT_MODEL, 60)
    assert failures == []
    # the restarted agent is sent the same settings on register: they change nothing
    wait_for(lambda: "settings are those the agent runs on" in _log(cluster), 30, "the same settings again")
    assert _log(cluster).count("restarting the agent") == 1
    assert yaml.safe_load((_node(cluster) / "settings.yaml").read_text()) == {"shards": {"stop_grace_s": 7}}
    assert 'running with the control plane\'s settings: {"shards": {"stop_grace_s": 7}}' in _log(cluster)
    after = cluster.replicas(DEFAULT_MODEL)[0]
    assert engine_pid(after["port"]) == pid
    shown = CliRunner().invoke(ctl.app, ["config", "history", "agents.nodes.node1", *_options(cluster)])
    assert "stop_grace_s" in shown.output


def test_llmgw_restart_restarts_the_agent_with_its_engine_serving(cluster: Cluster) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    registrations = _log(cluster).count("registered with")
    with requests_meanwhile(cluster) as failures:
        answer = CliRunner().invoke(app, ["restart", "--reason", "new build", *_options(cluster)])
        assert answer.exit_code == 0, answer.output
        assert "node1" in answer.output
        restarted(cluster, "new build", registrations)
        cluster.wait_ready(DEFAULT_MODEL, 60)
    assert failures == []
    assert engine_pid(cluster.replicas(DEFAULT_MODEL)[0]["port"]) == pid


def test_an_edited_agent_yaml_is_refused_when_it_does_not_load_and_restarts_the_agent_when_it_does(
    cluster: Cluster,
) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    path = _node(cluster) / "agent.yaml"
    good = path.read_text()
    path.write_text(good.replace("restart_backoff_s: 1.0", "restart_backoff_s: soon"))
    wait_for(lambda: "refused the edited agent.yaml" in _log(cluster), 30, "the agent refuses the edit")
    assert "shards.restart_backoff_s" in _log(cluster)
    assert cluster.processes["agent-node1"].poll() is None
    registrations = _log(cluster).count("registered with")
    path.write_text(good.replace("restart_backoff_s: 1.0", "restart_backoff_s: 2.0"))
    restarted(cluster, f"{path} changed", registrations)
    cluster.wait_ready(DEFAULT_MODEL, 60)
    assert engine_pid(cluster.replicas(DEFAULT_MODEL)[0]["port"]) == pid


def test_settings_the_agent_cannot_start_on_are_refused_and_it_serves_on_its_last_good_ones(
    cluster: Cluster,
) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    good = cluster.admin.get("/api/settings").get("agents.nodes.node1") or {}
    with requests_meanwhile(cluster) as failures:
        answer = CliRunner().invoke(
            ctl.app,
            ["config", "set", "agents.nodes.node1", yaml.safe_dump({**good, "work_dir": "/proc/llmgw"}),
             *_options(cluster)],
        )  # fmt: skip
        assert answer.exit_code == 0, answer.output
        wait_for(
            lambda: "could not start on the control plane's settings" in _log(cluster),
            60,
            "the agent goes back",
        )
        wait_for(
            lambda: "declined the control plane's settings" in _log(cluster), 60, "it declines them again"
        )
        cluster.wait_ready(DEFAULT_MODEL, 60)
    assert failures == []
    assert cluster.processes["agent-node1"].poll() is None, "the agent ended instead of going back"
    assert engine_pid(cluster.replicas(DEFAULT_MODEL)[0]["port"]) == pid
    assert kept_settings(_node(cluster) / "agent.yaml") == good
    shown = CliRunner().invoke(ctl.app, ["status", *_options(cluster)], env={"COLUMNS": "300"})
    assert "refused settings on node1" in shown.output, shown.output
    assert "work_dir=/proc/llmgw" in shown.output and "No such file or directory" in shown.output
    # the operator puts the good settings back: the refusal is withdrawn, nothing restarts
    answer = CliRunner().invoke(
        ctl.app, ["config", "set", "agents.nodes.node1", yaml.safe_dump(good), *_options(cluster)]
    )
    assert answer.exit_code == 0, answer.output
    wait_for(lambda: cluster.admin.get("/api/status")["refused_settings"] == {}, 60, "the refusal goes")
    assert engine_pid(cluster.replicas(DEFAULT_MODEL)[0]["port"]) == pid
