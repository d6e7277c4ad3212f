"""The agent starting again on the control plane's settings and on an edited agent.yaml (C2.4)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from llmgw.agent.config import (
    AgentConfig,
    load_agent_config,
    save_agent_config,
    settings_path,
    settings_problems,
)
from llmgw.agent.restarting import Restarting


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    save_agent_config(AgentConfig(node_id="gpu1", control_planes=["127.0.0.1:7000"]), path)
    return path


def restarting(path: Path) -> tuple[Restarting, list[str]]:
    asked: list[str] = []
    return Restarting(path, asked.append), asked


def test_settings_are_checked_as_agent_yaml_without_its_own_keys() -> None:
    assert settings_problems({"shards": {"stop_grace_s": 2}, "run_as": ""}) == []
    assert [f for f, _ in settings_problems({"node_id": "x", "tls": {}})] == ["node_id", "tls"]
    assert [f for f, _ in settings_problems({"shards": {"grace": 2}})] == ["shards.grace"]
    assert settings_problems("shards: 1") != []


def test_new_settings_are_kept_beside_agent_yaml_and_the_agent_restarts(config_path: Path) -> None:
    watcher, asked = restarting(config_path)
    watcher.on_settings("shards: {stop_grace_s: 2.5}\nports: {first: 22000, last: 22100}\n")
    assert asked == ["the control plane's settings changed"]
    assert yaml.safe_load(settings_path(config_path).read_text())["shards"] == {"stop_grace_s": 2.5}
    loaded = load_agent_config(config_path)
    assert (loaded.shards.stop_grace_s, loaded.ports.first, loaded.node_id) == (2.5, 22000, "gpu1")


def test_settings_equal_to_those_it_runs_change_nothing(config_path: Path) -> None:
    restarting(config_path)[0].on_settings("shards: {stop_grace_s: 2.5}\n")
    again, asked = restarting(config_path)
    again.on_settings("shards:\n  stop_grace_s: 2.5\n")
    assert asked == []
    empty, asked = restarting(config_path.parent / "other.yaml")
    empty.on_settings("{}\n")
    assert asked == []


def test_settings_that_do_not_load_are_refused_and_logged(
    config_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher, asked = restarting(config_path)
    with caplog.at_level(logging.ERROR):
        watcher.on_settings("control_planes: ['10.0.0.1:7000']\n")
        watcher.on_settings("ports: {first: 22000, last: 21000, colour: red}\n")
        watcher.on_settings("shards: [\n")
    assert asked == []
    assert not settings_path(config_path).exists()
    assert "control_planes" in caplog.text and "ports.colour" in caplog.text and "not YAML" in caplog.text


def test_an_edited_agent_yaml_that_loads_restarts_the_agent(config_path: Path) -> None:
    watcher, asked = restarting(config_path)
    watcher.check_file()
    assert asked == []
    config_path.write_text(config_path.read_text().replace("stop_grace_s: 10.0", "stop_grace_s: 4.0"))
    watcher.check_file()
    assert asked == [f"{config_path} changed"]


def test_an_edited_agent_yaml_that_does_not_load_is_refused_once_and_logged(
    config_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher, asked = restarting(config_path)
    good = config_path.read_text()
    config_path.write_text(good.replace("stop_grace_s: 10.0", "stop_grace_s: soon"))
    with caplog.at_level(logging.ERROR):
        watcher.check_file()
        watcher.check_file()
    refusals = [r.getMessage() for r in caplog.records if "refused the edited agent.yaml" in r.getMessage()]
    assert len(refusals) == 1 and "shards.stop_grace_s" in refusals[0]
    assert asked == []
    config_path.write_text(good)
    watcher.check_file()
    assert asked == []


def test_kept_settings_that_no_longer_load_are_left_aside(
    config_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings_path(config_path).write_text("shards: {stop_grace_s: 2.0}\nports: {first: 23000}\n")
    assert load_agent_config(config_path).shards.stop_grace_s == 2.0
    settings_path(config_path).write_text("shards: {stop_grace_s: soon}\nports: {first: 23000}\n")
    with caplog.at_level(logging.ERROR):
        loaded = load_agent_config(config_path)
    assert loaded.ports.first == 21000 and loaded.shards.stop_grace_s == 10.0
    assert "settings aside" in caplog.text and "shards.stop_grace_s" in caplog.text
