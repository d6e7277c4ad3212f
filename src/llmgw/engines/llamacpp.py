"""llama.cpp's ``llama-server``: its command line, health, metrics and where it computes.

Facts of the real binary this module relies on (checked against a build of
llama.cpp's server):

- ``GET /health`` answers without the API key: 503 while the model loads,
  200 ``{"status":"ok"}`` once it serves. ``/metrics`` and ``/v1/*`` demand
  the key (401 without it); ``/metrics`` exists only with ``--metrics``.
- ``--api-key-file FNAME`` reads the keys from a file, one per line (empty
  lines and lines starting with ``#`` skipped; ``common/arg.cpp``), so the
  key stays off the command line; ``--api-key`` would show it to ``ps``.
- LoRA adapters load at start: ``--lora FNAME`` applies one fully,
  ``--lora-scaled FNAME:SCALE`` at a scale (both also take comma-separated
  lists, so a file name must hold no ``,`` or ``:``); ``GET /lora-adapters``
  lists them with their ids, paths and scales.
- ``--ctx-size`` is the context of all ``--parallel`` slots together: each
  slot (one request at a time) gets ``ctx_size / parallel`` tokens. llmgw's
  ``ctx_size`` is the context of one request on every engine, so llama.cpp
  is started with ``--ctx-size`` ``ctx_size x parallel`` (0 stays 0: the
  model's own context, shared by the slots).
- The library's start-up lines (devices used, layers offloaded, buffers) are
  info messages that llama-server prints only from verbosity 4 on, so the
  engine is started with ``--verbosity 4``; request lines stay quiet.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp

from llmgw.core.engines import LLAMA_CPP
from llmgw.engines import engine
from llmgw.engines.engine import Compute, EngineLoad, Launch, MetricNames
from llmgw.errors import ConfigError

__all__ = ["ENGINE", "Compute", "EngineLoad", "command_line", "health", "parse_compute", "parse_metrics"]

CAPABILITIES = LLAMA_CPP
NAME = CAPABILITIES.name
BINARY = "llama-server"
HEALTH_PATH = CAPABILITIES.health_path
METRICS_PATH = CAPABILITIES.metrics_path
VERBOSITY = 4
"""The lowest verbosity at which llama-server prints where the model's layers went."""

OWN_FLAGS = frozenset(
    {
        "-m",
        "--model",
        "-a",
        "--alias",
        "--host",
        "--port",
        "--api-key",
        "--api-key-file",
        "--metrics",
        "-lv",
        "--verbosity",
        "--log-verbosity",
    }
)
"""Flags llmgw sets itself; extra args may not repeat them (llama.cpp lets the last one win)."""


def command_line(
    binary: Path,
    weights: Path,
    *,
    port: int,
    key_file: Path,
    ctx_size: int,
    parallel: int,
    args: Sequence[str] = (),
    host: str = "127.0.0.1",
    gpu_layers: int | None = None,
    alias: str | None = None,
) -> list[str]:
    """The argv that starts ``llama-server`` for one replica, guarded by the key in ``key_file``.

    ``ctx_size`` is the context of one request; ``--ctx-size`` gets it times ``parallel``.
    """
    if key_file == Path():
        raise ConfigError(
            "llama-server needs an API key file",
            hint="write the replica's key into a 0600 file; every engine is started with one",
        )
    if not 0 < port < 65536:
        raise ConfigError(f"port {port} is out of range", hint="use a port between 1 and 65535")
    if ctx_size < 0 or parallel < 1:
        raise ConfigError(
            f"ctx_size {ctx_size} and parallel {parallel} cannot be used",
            hint="ctx_size is 0 (the model's own) or more; parallel is 1 or more",
        )
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in OWN_FLAGS:
            raise ConfigError(
                f"llama.cpp args may not set {flag}",
                hint="llmgw sets the model, address, key, metrics and log level itself; remove it from args",
            )
    argv = [
        str(binary),
        "--model", str(weights),
        "--host", host,
        "--port", str(port),
        CAPABILITIES.key_input.name, str(key_file),
        "--metrics",
        "--ctx-size", str(total_context(ctx_size, parallel)),
        "--parallel", str(parallel),
        "--no-webui",
        "--verbosity", str(VERBOSITY),
    ]  # fmt: skip
    if alias:
        argv += ["--alias", alias]
    if gpu_layers is not None:
        argv += ["-ngl", str(gpu_layers)]
    argv += list(args)
    return argv


def total_context(ctx_size: int, parallel: int) -> int:
    """llama.cpp's ``--ctx-size`` for ``parallel`` requests of ``ctx_size`` tokens each (0: its own)."""
    return ctx_size * parallel


def task_arguments(launch: Launch) -> list[str]:
    """``--embeddings`` or ``--reranking`` (with ``--pooling``) for what the replica serves; none for chat."""
    flags = {"embeddings": ["--embeddings"], "rerank": ["--reranking"]}.get(launch.serves, [])
    if flags and launch.pooling:
        flags += ["--pooling", launch.pooling]
    return flags


async def health(
    session: aiohttp.ClientSession, base_url: str, api_key: str, *, timeout: float = 5.0
) -> bool:
    """True once the model is loaded and the server answers; False while loading or unreachable."""
    try:
        async with session.get(
            base_url.rstrip("/") + HEALTH_PATH,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


METRICS = {
    "running": "llamacpp:requests_processing",
    "waiting": "llamacpp:requests_deferred",
    "kv_cache_usage": "llamacpp:kv_cache_usage_ratio",
    "prompt_tokens_total": "llamacpp:prompt_tokens_total",
    "generated_tokens_total": "llamacpp:tokens_predicted_total",
}
"""EngineLoad's fields and the Prometheus names llama-server gives them.

``kv_cache_usage_ratio`` was published by older releases and is gone from
current ones; it is read when present.
"""


def parse_metrics(text: str | bytes) -> EngineLoad:
    """Read llama-server's Prometheus text into an EngineLoad; absent counters read as 0.

    EngineUnhealthy for text that is not Prometheus's or a value that is no count.
    """
    return engine.parse_load(text, replace(ENGINE.metrics, required=()), NAME)


async def read_load(
    session: aiohttp.ClientSession, base_url: str, api_key: str, *, timeout: float = 5.0
) -> EngineLoad:
    """Fetch and parse /metrics (it needs the key); EngineUnhealthy when it cannot be read."""
    return await engine.read_load(ENGINE, session, base_url, api_key, timeout=timeout)


_USING_DEVICE = re.compile(r"using device (?P<name>[A-Za-z]+\d+)\b")
_BUFFER = re.compile(r"\b(?P<name>(?:CUDA|Vulkan)\d+) (?:model|KV|compute) buffer size")
_OFFLOADED = re.compile(r"offloaded (?P<done>\d+)/(?P<total>\d+) layers to GPU")
_BACKENDS = (("CUDA", "cuda"), ("Vulkan", "vulkan"))


def parse_compute(log_text: str) -> Compute:
    """Read the devices, backend and offloaded layers from llama-server's start-up output.

    Nothing that names a GPU means the CPU. A GPU build that offloaded no
    layer also computes on the CPU, and reads as such (its devices kept).
    """
    devices: list[str] = []
    offloaded: int | None = None
    total: int | None = None
    for line in log_text.splitlines():
        for pattern in (_USING_DEVICE, _BUFFER):
            match = pattern.search(line)
            if match and match["name"] not in devices:
                devices.append(match["name"])
        match = _OFFLOADED.search(line)
        if match:
            offloaded, total = int(match["done"]), int(match["total"])
    gpus = tuple(name for name in devices if name.startswith(tuple(prefix for prefix, _ in _BACKENDS)))
    backend = "cpu"
    if gpus and offloaded != 0:
        prefix = gpus[0].rstrip("0123456789")
        backend = dict(_BACKENDS).get(prefix, "cpu")
    return Compute(backend=backend, devices=gpus, layers_offloaded=offloaded, layers_total=total)


def lora_arguments(launch: Launch) -> list[str]:
    """``--lora FILE`` per adapter, ``--lora-scaled FILE:SCALE`` where the adapter has a scale."""
    argv: list[str] = []
    for adapter in launch.adapters:
        if adapter.scale is None:
            argv += ["--lora", str(adapter.path)]
        else:
            argv += ["--lora-scaled", f"{adapter.path}:{adapter.scale:g}"]
    return argv


class LlamaCppEngine:
    """llama-server behind the :class:`~llmgw.engines.engine.Engine` interface."""

    capabilities = CAPABILITIES
    name = NAME
    health_path = HEALTH_PATH
    metrics_path = METRICS_PATH
    metrics = MetricNames(
        running=(METRICS["running"],),
        waiting=(METRICS["waiting"],),
        kv_cache_usage=(METRICS["kv_cache_usage"],),
        prompt_tokens_total=(METRICS["prompt_tokens_total"],),
        generated_tokens_total=(METRICS["generated_tokens_total"],),
    )

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        launch.checked(NAME)
        _flag, key_file = engine.key_arguments(CAPABILITIES, launch)
        argv = command_line(
            program,
            launch.weights,
            port=launch.port,
            key_file=Path(key_file),
            ctx_size=launch.ctx_size,
            parallel=launch.parallel,
            args=launch.args,
            host=launch.host,
            alias=launch.model,
        )
        if launch.projector is not None:
            argv[1:1] = ["--mmproj", str(launch.projector)]
        return argv + task_arguments(launch) + lora_arguments(launch)

    def default_environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        return parse_compute(log_text)


ENGINE = LlamaCppEngine()
