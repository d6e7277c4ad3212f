"""The agent's Prometheus metrics, on their own registry, served at its ``/metrics``.

Engines started and restarted, weights fetched, builds set up, KV-event gaps,
and the GPU metrics of the samples the agent already takes (the same names as
the control plane's, for this node alone). docs/metrics.md lists every name.
The registry is the agent's own (:data:`REGISTRY`), not the process-wide
default, so what an agent serves is exactly this list wherever it runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.core.telemetry import Telemetry
from llmgw.errors import LlmgwError
from llmgw.observability.gpu_metrics import GpuMetrics

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()
"""Everything the agent's ``/metrics`` serves."""

ENGINE_STARTS = Counter(
    "llmgw_agent_engine_starts",
    "Engine processes the agent launched (first starts and restarts), by engine.",
    ["engine"],
    registry=REGISTRY,
)
ENGINE_RESTARTS = Counter(
    "llmgw_agent_engine_restarts",
    "Engines started again after they exited, crashed or stopped answering, by engine.",
    ["engine"],
    registry=REGISTRY,
)
WEIGHTS_FETCHED_BYTES = Counter(
    "llmgw_agent_weights_fetched_bytes",
    "Bytes of weights, adapters and model files fetched from the mirror.",
    registry=REGISTRY,
)
BUILDS_INSTALLED = Counter(
    "llmgw_agent_builds_installed",
    "Engine builds set up for this node's shards (installed, or found in the cache), once per run.",
    ["engine"],
    registry=REGISTRY,
)
KV_GAPS_REPLAYED = Counter(
    "llmgw_agent_kv_event_gaps_replayed",
    "Gaps in engines' KV events filled from the engine's replay buffer.",
    registry=REGISTRY,
)
KV_BLOCKS_CHECKED = Counter(
    "llmgw_agent_kv_blocks_checked",
    "Blocks of engines' KV events hashed again as llmgw hashes prompts, by whether the engine's hash "
    "agreed (a disagreeing engine's blocks never match a prompt: check its hash algorithm and seed).",
    ["agreed"],
    registry=REGISTRY,
)
KV_RESETS = Counter(
    "llmgw_agent_kv_event_resets",
    "Gaps in engines' KV events replay could not fill (or an engine that started over): the mirror reset.",
    registry=REGISTRY,
)
GPUS = GpuMetrics(REGISTRY)
"""The cards' metrics, from each telemetry sample."""


def engine_started(engine: str, *, again: bool) -> None:
    """An engine process was launched; ``again``: its shard had run one before (a restart)."""
    name = engine or DEFAULT_ENGINE
    ENGINE_STARTS.labels(name).inc()
    if again:
        ENGINE_RESTARTS.labels(name).inc()


def publishing_gpus(node_id: str, publish: Callable[[Telemetry], None]) -> Callable[[Telemetry], None]:
    """``publish`` (up the stream) that first sets the GPU metrics from the sample."""

    def both(telemetry: Telemetry) -> None:
        GPUS.update(node_id, telemetry)
        publish(telemetry)

    return both


def metrics_app(registry: CollectorRegistry = REGISTRY) -> web.Application:
    """An aiohttp app answering ``GET /metrics`` from ``registry``."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def serve_metrics(host: str, port: int, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``/metrics`` on ``host:port`` until cancelled (the agent's ``metrics`` component)."""
    runner = web.AppRunner(metrics_app(registry), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as error:
            raise LlmgwError(
                f"the agent cannot serve its metrics on {host}:{port}: {error.strerror or error}",
                "set metrics.port in agent.yaml to a free port (0 serves no metrics)",
            ) from error
        log.info("metrics at http://%s:%d/metrics", host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
