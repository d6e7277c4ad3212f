"""Agents' settings from the cluster: ``agents.default`` and ``agents.nodes.<id>`` (C2.4).

They hold everything agent.yaml can say but what only the node's own file
may say: its id, the control planes, its address and its certificate. A
node's settings are ``agents.default`` with ``agents.nodes.<id>`` merged over
it, key by key.
"""

from __future__ import annotations

from typing import Any

DEFAULT_KEY = "agents.default"
NODE_PREFIX = "agents.nodes."
FORBIDDEN = ("node_id", "control_planes", "address", "tls", "release")
"""agent.yaml's keys that stay in the node's file: refused in the cluster's settings."""


def is_agent_key(key: str) -> bool:
    """Whether ``key`` is one of the agents' settings (or claims to be, under ``agents.``)."""
    return key == "agents" or key.startswith("agents.")


def key_problem(key: str) -> str:
    """Why ``key`` cannot hold agents' settings; empty when it can."""
    if key == DEFAULT_KEY:
        return ""
    if key.startswith(NODE_PREFIX) and key[len(NODE_PREFIX) :] and "." not in key[len(NODE_PREFIX) :]:
        return ""
    return f"agents' settings live under {DEFAULT_KEY} or {NODE_PREFIX}<node id>, not {key}"


def forbidden_keys(data: dict[str, Any]) -> list[str]:
    """The keys of ``data`` that only the node's own agent.yaml may set."""
    return [key for key in FORBIDDEN if key in data]


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base``: sections merged key by key, anything else replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def node_settings(default: Any, node: Any) -> dict[str, Any]:
    """One node's settings: ``agents.default`` with ``agents.nodes.<id>`` over it."""
    return merge(default if isinstance(default, dict) else {}, node if isinstance(node, dict) else {})
