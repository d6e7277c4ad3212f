"""Agents' settings: the node's own keys, merging, where they live."""

from __future__ import annotations

from llmgw.core.agentsettings import forbidden_keys, is_agent_key, key_problem, merge, node_settings


def test_the_node_s_own_keys_are_found_by_name() -> None:
    data = {"tls": {}, "shards": {}, "node_id": "x", "address": "1.2.3.4", "control_planes": []}
    assert sorted(forbidden_keys(data)) == ["address", "control_planes", "node_id", "tls"]
    assert forbidden_keys({"shards": {"stop_grace_s": 1}, "run_as": ""}) == []
    assert forbidden_keys({"release": {"trusted_pub": "/tmp/other.pub"}}) == ["release"]


def test_sections_merge_key_by_key_and_the_rest_is_replaced() -> None:
    base = {"shards": {"stop_grace_s": 1, "health_timeout_s": 5}, "ports": {"first": 1}, "run_as": "a"}
    over = {"shards": {"stop_grace_s": 2}, "ports": 7, "run_as": "b"}
    assert merge(base, over) == {
        "shards": {"stop_grace_s": 2, "health_timeout_s": 5},
        "ports": 7,
        "run_as": "b",
    }
    assert base["shards"] == {"stop_grace_s": 1, "health_timeout_s": 5}


def test_a_node_s_settings_are_the_default_with_its_own_over_it() -> None:
    assert node_settings({"run_as": "a", "shards": {"x": 1}}, {"shards": {"y": 2}}) == {
        "run_as": "a",
        "shards": {"x": 1, "y": 2},
    }
    assert node_settings(None, None) == {}


def test_agents_settings_live_under_default_or_one_node() -> None:
    assert is_agent_key("agents.default") and not is_agent_key("serving.stopped")
    assert key_problem("agents.default") == key_problem("agents.nodes.gpu1") == ""
    for wrong in ("agents", "agents.nodes.", "agents.nodes.a.b", "agents.gpu1"):
        assert "agents.nodes.<node id>" in key_problem(wrong)
