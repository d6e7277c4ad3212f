"""server.yaml: the routing section reaches the router; a bad routing field is named; training's grace."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.controlplane.config import load_server_config, save_server_config
from llmgw.errors import LlmgwError


def test_routing_settings_are_read_from_server_yaml(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("name: cp1\nrouting:\n  policy: prefix\n  saturation: 2.5\n")
    config = load_server_config(path)
    assert config.routing.policy == "prefix"
    assert config.routing.saturation == 2.5
    assert config.routing.load_weight == 0.5  # the default kept
    save_server_config(config, path)
    assert load_server_config(path).routing == config.routing


def test_an_unknown_policy_is_refused_with_its_field(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("routing:\n  policy: random\n")
    with pytest.raises(LlmgwError) as raised:
        load_server_config(path)
    assert "routing.policy" in str(raised.value)
    assert "round-robin" in str(raised.value)


def test_a_misspelt_routing_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("routing:\n  saturaton: 2\n")
    with pytest.raises(LlmgwError) as raised:
        load_server_config(path)
    assert "routing.saturaton" in str(raised.value)


def test_a_training_node_has_its_own_grace_minutes_by_default(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("name: cp1\nreconcile:\n  node_grace_s: 10\n")
    config = load_server_config(path)
    assert (config.reconcile.node_grace_s, config.training.node_grace_s) == (10, 300)
    path.write_text("training:\n  node_grace_s: 900\n")
    assert load_server_config(path).training.node_grace_s == 900
    path.write_text("training:\n  node_grace_s: -1\n")
    with pytest.raises(LlmgwError, match=r"training\.node_grace_s"):
        load_server_config(path)


def test_a_metrics_address_is_read_as_host_and_port(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("http:\n  metrics_address: '10.0.0.5:9108'\n")
    assert load_server_config(path).http.metrics_host_port() == ("10.0.0.5", 9108)
    path.write_text("http:\n  metrics_address: '[::1]:9108'\n")
    assert load_server_config(path).http.metrics_host_port() == ("::1", 9108)


@pytest.mark.parametrize("address", ["9108", "10.0.0.5", "10.0.0.5:http", "10.0.0.5:70000"])
def test_a_metrics_address_without_a_port_is_refused_naming_the_field(tmp_path: Path, address: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(f"http:\n  metrics_address: '{address}'\n")
    with pytest.raises(LlmgwError) as raised:
        load_server_config(path)
    assert "http.metrics_address" in str(raised.value) and "host:port" in str(raised.value)
