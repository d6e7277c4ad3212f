"""What every engine module offers: a command line from a profile, health, load and compute.

An engine module (``llamacpp``, ``vllm``, ``sglang``, ``trtllm``) is one
object of :class:`Engine`; :func:`llmgw.engines.registry.engine_named` finds
it by the name a profile gives. The agent launches through it and the router
reads load through it, so nothing outside ``engines/`` knows an engine's
flags or metric names. Its facts (formats, adapters, paths, the flags llmgw
sets) are its row in :mod:`llmgw.core.engines`, which the object points at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

from llmgw.core.engines import EngineCapabilities, KeyPassing
from llmgw.core.shards import Rendezvous
from llmgw.engines import prometheus
from llmgw.errors import ConfigError, EngineUnhealthy


@dataclass(frozen=True)
class LaunchAdapter:
    """A LoRA adapter on the node, as an engine is given it."""

    name: str
    """The name requests ask for it by."""
    path: Path
    """The PEFT folder (vLLM) or the GGUF LoRA file (llama.cpp)."""
    scale: float | None = None
    """llama.cpp: how strongly it applies; None: fully."""


@dataclass(frozen=True)
class Launch:
    """One replica's engine start: what the agent knows when it launches it."""

    weights: Path
    """The GGUF file, or the folder holding a safetensors repository."""
    port: int
    api_key: str = field(repr=False)
    """The replica's own key; the engine demands it on every request. Never on a command line:
    the engine reads it from :attr:`key_file` or a variable (its row's ``key_input``)."""
    model: str
    """The name the engine serves the model under (the catalog's name)."""
    host: str = "127.0.0.1"
    ctx_size: int = 4096
    """The context of one request, in tokens (the profile's ``ctx_size``); llama.cpp is given it
    times :attr:`parallel`, the other engines take it as is."""
    parallel: int = 4
    """Requests served at once."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree: stages the model is cut into (tp x pp cards in all)."""
    args: tuple[str, ...] = ()
    """The profile's extra arguments (checked by :mod:`llmgw.core.validation`)."""
    projector: Path | None = None
    """A GGUF vision model's projector file."""
    kv_events_port: int | None = None
    """Loopback port the engine publishes KV-cache events to (vLLM with ``kv_events``)."""
    kv_replay_port: int | None = None
    """Loopback port the engine answers KV-event replay requests on (vLLM with ``kv_events``)."""
    max_loaded_adapters: int = 0
    """vLLM: adapters held at once, loaded at run time."""
    adapters: tuple[LaunchAdapter, ...] = ()
    """LoRA adapters given at start (none with ``max_loaded_adapters``: those load at run time)."""
    max_lora_rank: int = 0
    """vLLM: the largest adapter rank (``--max-lora-rank``); 0: the engine's default."""
    devices: tuple[int, ...] = ()
    """Cards the engine was given (CUDA indexes)."""
    key_file: Path | None = None
    """The 0600 file the agent wrote the key into, for an engine that reads it from a file."""
    serves: str = "chat"
    """What the engine is started for: ``chat``, ``embeddings`` or ``rerank`` (``core.engines.Task``)."""
    pooling: str = ""
    """llama.cpp: ``--pooling`` for an embedding model; empty: the model's own."""
    comfyui_nodes: tuple[str, ...] = ()
    """ComfyUI: the replica's custom nodes as JSON (``{"repository", "commit", "packages"}``)."""
    comfyui_hf_repository: str = ""
    """ComfyUI: the Hugging Face repository (``ORG/NAME``) the fetched weights folder is a snapshot of."""
    entry: Path | None = None
    """The script the engine's program runs (ComfyUI's ``main.py``); None for the others."""
    rendezvous: Rendezvous | None = None
    """A shard of a multi-node replica: its rank, the node count and the head's ``HOST:PORT``."""

    def checked(self, engine: str) -> None:
        """ConfigError unless the key and port can start an engine."""
        if not self.api_key:
            raise ConfigError(
                f"{engine} needs an API key", hint="pass the replica's key; every engine is started with one"
            )
        if not 0 < self.port < 65536:
            raise ConfigError(f"port {self.port} is out of range", hint="use a port between 1 and 65535")


def key_arguments(capabilities: EngineCapabilities, launch: Launch) -> list[str]:
    """The flag naming the key file (``--api-key-file PATH``); none for an engine reading a variable.

    ConfigError when the engine reads its key from a file and none was written.
    """
    source = capabilities.key_input
    if not source.in_file:
        return []
    if launch.key_file is None:
        raise ConfigError(
            f"{capabilities.title} reads its key from a file and none was given",
            hint="the agent writes the replica's key file into the shard's directory before it starts it",
        )
    return [source.name, str(launch.key_file)]


def key_environment(capabilities: EngineCapabilities, launch: Launch) -> dict[str, str]:
    """The variable holding the key, for an engine that reads it from one; empty otherwise."""
    source = capabilities.key_input
    return {source.name: launch.api_key} if source.passing is KeyPassing.ENV else {}


@dataclass(frozen=True)
class EngineLoad:
    """One reading of an engine's metrics, in the router's terms (C6.2)."""

    running: int = 0
    """Requests being processed now."""
    waiting: int = 0
    """Requests queued for a free slot."""
    kv_cache_usage: float | None = None
    """Share of the KV cache in use, 0..1; None where the engine does not publish it."""
    prompt_tokens_total: int = 0
    """Prompt tokens processed since start."""
    generated_tokens_total: int = 0
    """Tokens generated since start."""
    queue_reported: bool = True
    """False where the text holds neither queue gauge (TensorRT-LLM before its first iteration
    statistics, or 1.1, which has none): ``running`` and ``waiting`` then read 0, and the router
    counts only its own requests in flight on the replica."""


@dataclass(frozen=True)
class Compute:
    """Where an engine really computes."""

    backend: str = "cpu"
    """``cpu``, ``cuda`` or ``vulkan``."""
    devices: tuple[str, ...] = ()
    """The engine's names of the GPUs it uses (``CUDA0``); empty on the CPU."""
    layers_offloaded: int | None = None
    """Layers placed on GPUs (llama.cpp); None where the engine does not say."""
    layers_total: int | None = None

    @property
    def all_on_gpu(self) -> bool:
        if self.layers_total is None:
            return self.backend != "cpu"
        return self.backend != "cpu" and self.layers_offloaded == self.layers_total


@dataclass(frozen=True)
class MetricNames:
    """An engine's Prometheus names for each field of :class:`EngineLoad`, newest first."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_cache_usage: tuple[str, ...] = ()
    prompt_tokens_total: tuple[str, ...] = ()
    generated_tokens_total: tuple[str, ...] = ()
    kv_scale: float = 1.0
    """Multiplier bringing the KV gauge to 0..1."""
    rank_labels: tuple[str, ...] = ()
    """Labels telling apart ranks of one engine that each report the same requests (SGLang's
    scheduler of every pipeline stage): the series of a name alike but for these count once."""
    share_labels: tuple[str, ...] = ()
    """Labels that, set to anything but empty, mark a series as a share of the total beside it
    (SGLang's per-priority queue counts): such series are not added to it."""
    required: tuple[str, ...] = field(default=("running", "waiting"))
    """Fields whose absence means the text is not this engine's metrics. An engine that may
    publish no queue gauges leaves ``running`` and ``waiting`` out: the load then says
    :attr:`EngineLoad.queue_reported` False instead of failing."""


class Engine(Protocol):
    """One engine's facts, as the agent and the router use them."""

    capabilities: EngineCapabilities
    """The engine's row in :mod:`llmgw.core.engines`."""
    name: str
    health_path: str
    metrics_path: str
    metrics: MetricNames

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        """The argv that starts the engine for one replica."""
        ...

    def environment(self, launch: Launch) -> dict[str, str]:
        """Variables the agent sets for the engine (on top of the profile's checked env)."""
        ...

    def default_environment(self, launch: Launch) -> dict[str, str]:
        """Variables the agent sets for the engine unless the profile's env sets them."""
        ...

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        """Where the engine computes, from its start-up output and what it was given."""
        ...


COUNT_LIMIT = 2**53
"""Counts above this are refused: a float holds every integer only up to here."""


def parse_load(text: str | bytes, names: MetricNames, engine: str = "engine") -> EngineLoad:
    """Read Prometheus text into an EngineLoad; EngineUnhealthy when it cannot be one.

    Series of one name (ranks, labels) are summed, but for those the names say repeat one count
    (:attr:`MetricNames.rank_labels`) or share one out (:attr:`MetricNames.share_labels`); the KV
    gauge takes the fullest.
    Text that is not Prometheus's format, a missing required gauge, and a value
    that is no count (``+Inf``, ``NaN``, negative, past :data:`COUNT_LIMIT`) or no
    finite share all make the reading fail, so the replica is routed around.
    """
    try:
        found = prometheus.values_by_name(prometheus.parse(text), names.rank_labels, names.share_labels)
    except prometheus.MetricsTextError as error:
        raise EngineUnhealthy(
            f"{engine} metrics are not Prometheus text: {error}",
            hint="check the engine's version and that its metrics route serves Prometheus's text format",
        ) from None

    def first(field_name: str) -> tuple[str, list[float]] | None:
        for name in getattr(names, field_name):
            if name in found:
                return name, found[name]
        return None

    for field_name in names.required:
        if first(field_name) is None:
            wanted = " or ".join(getattr(names, field_name))
            raise EngineUnhealthy(
                f"{engine} metrics hold no {wanted}",
                hint="check the engine's version and that its metrics are turned on",
            )

    def count(field_name: str) -> int:
        series = first(field_name)
        if series is None:
            return 0
        name, values = series
        # each series within the limit first: their exact sum then cannot overflow
        in_range = all(math.isfinite(v) and 0 <= v <= COUNT_LIMIT for v in values)
        total = math.fsum(values) if in_range else math.nan
        if not 0 <= total <= COUNT_LIMIT:
            raise EngineUnhealthy(
                f"{engine} reports {name} = {_shown(values)}, which is not a count",
                hint="the replica is routed around until its metrics read as counts again; "
                "check the engine's version",
            )
        return int(total)

    def share() -> float | None:
        series = first("kv_cache_usage")
        if series is None:
            return None
        name, values = series
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise EngineUnhealthy(
                f"{engine} reports {name} = {_shown(values)}, which is not a share of the KV cache",
                hint="the replica is routed around until its metrics read as numbers again; "
                "check the engine's version",
            )
        return max(values) * names.kv_scale

    return EngineLoad(
        running=count("running"),
        waiting=count("waiting"),
        kv_cache_usage=share(),
        prompt_tokens_total=count("prompt_tokens_total"),
        generated_tokens_total=count("generated_tokens_total"),
        queue_reported=first("running") is not None or first("waiting") is not None,
    )


def _shown(values: list[float]) -> str:
    return " + ".join(repr(v) for v in values[:4]) + (" + ..." if len(values) > 4 else "")


def _auth(api_key: str) -> Mapping[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def health(
    engine: Engine, session: aiohttp.ClientSession, base_url: str, api_key: str, *, timeout: float = 5.0
) -> bool:
    """True once the engine serves; False while it loads or cannot be reached."""
    try:
        async with session.get(
            base_url.rstrip("/") + engine.health_path,
            headers=_auth(api_key),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def read_load(
    engine: Engine, session: aiohttp.ClientSession, base_url: str, api_key: str, *, timeout: float = 5.0
) -> EngineLoad:
    """Fetch and parse the engine's metrics; EngineUnhealthy when they cannot be read."""
    url = base_url.rstrip("/") + engine.metrics_path
    try:
        async with session.get(
            url, headers=_auth(api_key), timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            if response.status != 200:
                raise EngineUnhealthy(
                    f"{engine.name} at {base_url} answered {response.status} to {engine.metrics_path}",
                    hint="check that its metrics are turned on and it was given the replica's key",
                )
            text = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise EngineUnhealthy(
            f"cannot read {url}: {error or type(error).__name__}",
            hint="check that the engine process is running; the agent restarts it when it is not",
        ) from error
    return parse_load(text, engine.metrics, engine.name)


def cuda_devices(launch: Launch) -> Compute:
    """The compute of an engine that runs on the cards it was given (CPU when none)."""
    if not launch.devices:
        return Compute()
    return Compute(backend="cuda", devices=tuple(f"CUDA{index}" for index in launch.devices))
