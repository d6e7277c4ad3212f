"""The cluster settings llmgw reads, and their types: ``serving.stopped`` is a bool.

A setting changed through ``/api/settings`` must be one of these keys (or an
agents' key, ``agents.default`` and ``agents.nodes.<id>``), or it is refused
naming the closest keys: a setting nothing reads is a typo that would do
nothing. Its value must be of its type, or it is refused naming the type:
JSON's ``"false"`` is a string, and a string read as a flag is true, so
``{"value": "false"}`` would stop the cluster. Agents' settings are checked
as agent.yaml is (:mod:`llmgw.core.agentsettings`).
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgw.core.agentsettings import DEFAULT_KEY, NODE_PREFIX, is_agent_key
from llmgw.core.oidc import OIDC_SETTING, provider_problem
from llmgw.core.pricing import CURRENCY_SETTING, PRICE_PREFIX, currency_problem, price_problem, priced_model

SERVING_STOPPED = "serving.stopped"
"""``llmgw stop`` is in force while true (``/api/serving`` sets it)."""

VIP_SETTING = "leadership.vip"
"""The floating address keepalived keeps on the leader (``server add --vip``), known cluster-wide."""

HF_ENDPOINT_SETTING = "mirror.hf_endpoint"
"""Where ``mirror pull hf:...`` reaches Hugging Face's hub (as ``HF_ENDPOINT``)."""

OLLAMA_REGISTRY_SETTING = "mirror.ollama_registry"
"""Where ``mirror pull ollama:...`` reaches Ollama's registry."""

MIRROR_URL_SETTINGS = (HF_ENDPOINT_SETTING, OLLAMA_REGISTRY_SETTING)
FIREWALL_ENABLED = "firewall.enabled"
"""llmgw's nftables table on every node and control plane (default true; docs/operations.md)."""

FIREWALL_NETWORKS = "firewall.networks"
"""Who may reach control planes' HTTP port (``/v1``, ``/api``): addresses or CIDRs; empty: anyone."""

EMBEDDING_MODEL_SETTING = "knowledge.embedding_model"
"""The embedding model a new knowledge collection uses when it names none."""


@dataclass(frozen=True)
class SettingType:
    """What one setting holds."""

    words: str
    """The type as the refusal names it, with an example."""
    accepts: Callable[[Any], bool]


def _is_bool(value: Any) -> bool:
    return value is True or value is False


def _is_network(value: Any) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def _is_networks(value: Any) -> bool:
    return isinstance(value, list) and all(_is_network(item) for item in value)


TYPES: dict[str, SettingType] = {
    SERVING_STOPPED: SettingType("a JSON bool (true or false, without quotes)", _is_bool),
    VIP_SETTING: SettingType(
        'a JSON string (an address, "10.0.0.100/24")', lambda value: isinstance(value, str)
    ),
    **{
        key: SettingType(
            'a JSON string, an http(s) address ("https://huggingface.co")',
            lambda value: isinstance(value, str) and value.startswith(("http://", "https://")),
        )
        for key in MIRROR_URL_SETTINGS
    },
    FIREWALL_ENABLED: SettingType("a JSON bool (true or false, without quotes)", _is_bool),
    FIREWALL_NETWORKS: SettingType(
        'a JSON array of addresses or networks (["10.0.0.0/8", "192.168.1.5"])', _is_networks
    ),
    EMBEDDING_MODEL_SETTING: SettingType(
        'a JSON string (an embedding model\'s name, "minilm")', lambda value: isinstance(value, str)
    ),
    CURRENCY_SETTING: SettingType(
        'a JSON string of three capital letters (ISO 4217: "USD")', lambda value: not currency_problem(value)
    ),
    OIDC_SETTING: SettingType(
        'a JSON object naming an OpenID Connect provider ({"issuer", "client_id", ...}: docs/sign-in.md)',
        lambda value: not provider_problem(value),
    ),
}

KEYS: tuple[str, ...] = (*sorted(TYPES), DEFAULT_KEY, f"{NODE_PREFIX}<node id>", f"{PRICE_PREFIX}<model>")
"""Every key a setting may have, as a refusal lists them."""


def key_problem(key: str) -> str:
    """Why ``key`` is no setting llmgw reads, naming the closest ones (empty: it is one).

    Agents' keys (under ``agents.``) are checked with their values (:mod:`llmgw.core.agentsettings`).
    """
    if key in TYPES or is_agent_key(key) or priced_model(key) is not None:
        return ""
    close = difflib.get_close_matches(key, KEYS, n=3, cutoff=0.6)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    return f"{key} is not a setting llmgw reads; {guess}the settings are {', '.join(KEYS)}"


def json_kind(value: Any) -> str:
    """The JSON type of ``value``, as a person reads it: a string, a number, an object..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def value_problem(key: str, value: Any) -> str:
    """Why ``value`` is not of ``key``'s type (empty: it is, or ``key`` takes any JSON)."""
    if priced_model(key) is not None:
        return price_problem(key, value)
    if key == OIDC_SETTING:
        return provider_problem(value)
    kind = TYPES.get(key)
    if kind is None or kind.accepts(value):
        return ""
    return f"{key} takes {kind.words}, not {json_kind(value)}"
