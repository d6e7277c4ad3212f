"""The agent's /metrics: its own registry, served on its own port, GPU metrics from the samples it sends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.config import AgentConfig
from llmgw.agent.metrics import GPUS, REGISTRY, publishing_gpus, serve_metrics
from llmgw.core.telemetry import DeviceSample, Telemetry
from llmgw.errors import LlmgwError
from llmgw.testing.cluster import free_port
from llmgw.testing.eventually import eventually


@contextlib.asynccontextmanager
async def served(port: int, registry: CollectorRegistry = REGISTRY) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(serve_metrics("127.0.0.1", port, registry))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def scrape(port: int) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as answer:
        assert answer.status == 200
        return await answer.text()


def test_the_agent_serves_metrics_on_loopback_at_9464_by_default() -> None:
    config = AgentConfig(node_id="n1", control_planes=["127.0.0.1:1"])
    assert (config.metrics.host, config.metrics.port) == ("127.0.0.1", 9464)


async def test_metrics_are_served_from_the_agents_registry() -> None:
    registry = CollectorRegistry()
    Counter("llmgw_agent_probe", "A probe.", registry=registry).inc(3)
    port = free_port()
    async with served(port, registry):
        text = await eventually(lambda: scrape(port), message="the agent's /metrics answers")

    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["llmgw_agent_probe"].samples[0].value == 3


async def test_the_sample_sent_up_the_stream_sets_the_gpu_metrics_served() -> None:
    sent: list[Telemetry] = []
    sample = Telemetry(
        samples=(DeviceSample(device=0, device_class="h100-80g", memory_used_mb=1024, sm_clock_mhz=1980),)
    )
    publishing_gpus("gpu-7", sent.append)(sample)
    assert sent == [sample]

    port = free_port()
    async with served(port):
        text = await eventually(lambda: scrape(port), message="the agent's /metrics answers")
    labels = {"node": "gpu-7", "device": "0", "device_class": "h100-80g"}
    assert GPUS.registry.get_sample_value("llmgw_gpu_memory_used_bytes", labels) == 1024 << 20
    assert 'llmgw_gpu_sm_clock_hertz{device="0",device_class="h100-80g",node="gpu-7"} 1.98e+09' in text


async def test_a_port_in_use_fails_the_component_saying_what_to_set() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LlmgwError) as failure:
            await serve_metrics("127.0.0.1", port, CollectorRegistry())
    assert f"127.0.0.1:{port}" in failure.value.message
    assert failure.value.hint is not None and "metrics.port" in failure.value.hint
