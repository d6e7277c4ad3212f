"""TensorRT-LLM's metrics as its versions publish them, read as loads; the stand-in held to them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.engines import prometheus, trtllm
from llmgw.engines.engine import EngineLoad, parse_load
from llmgw.testing.engine_standin import StandinSettings
from llmgw.testing.trtllm_standin import IMITATES, TrtllmStandin

DATA = Path(__file__).parent / "data"


def recorded(version: str, state: str) -> str:
    return (DATA / f"trtllm-metrics-{version}-{state}.txt").read_text()


def shapes(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """Each sample's name and label names (values vary: model, process id)."""
    return {(s.name, tuple(key for key, _ in s.labels)) for s in prometheus.parse(text)}


@pytest.mark.parametrize("version", ["1.1", "1.3"])
def test_a_fresh_trtllm_without_queue_gauges_reads_as_a_load_of_the_routers_own_requests(
    version: str,
) -> None:
    load = parse_load(recorded(version, "fresh"), trtllm.ENGINE.metrics, "trtllm")
    assert load == EngineLoad(queue_reported=False)


def test_a_busy_trtllm_1_1_still_publishes_no_queue_gauges_and_stays_readable() -> None:
    load = parse_load(recorded("1.1", "busy"), trtllm.ENGINE.metrics, "trtllm")
    assert load == EngineLoad(queue_reported=False)


def test_a_busy_trtllm_1_3_reads_its_gauges_and_counters() -> None:
    load = parse_load(recorded("1.3", "busy"), trtllm.ENGINE.metrics, "trtllm")
    assert load == EngineLoad(
        running=2,
        waiting=1,
        kv_cache_usage=0.25,
        prompt_tokens_total=1200,
        generated_tokens_total=340,
        queue_reported=True,
    )


def standin(**changes: object) -> TrtllmStandin:
    settings = StandinSettings(engine="trtllm", served_name="m", startup_s=0.0, decode_s=0.0, prefill_s=0.0)
    settings.metrics_path = "/prometheus/metrics"
    for name, value in changes.items():
        setattr(settings, name, value)
    return TrtllmStandin(settings)


async def finish_one(engine: TrtllmStandin) -> None:
    async for _ in engine.generate([1, 2, 3], 2):
        pass


def test_the_stand_in_says_which_version_it_imitates() -> None:
    assert IMITATES.startswith("1.3")


async def test_a_fresh_stand_in_publishes_what_a_fresh_trtllm_does() -> None:
    engine = standin()
    assert shapes(engine.metrics_text()) == shapes(recorded("1.3", "fresh"))
    await finish_one(engine)
    assert shapes(engine.metrics_text()) != shapes(recorded("1.3", "fresh"))


async def test_a_busy_stand_in_publishes_only_what_a_busy_trtllm_does_queue_gauges_included() -> None:
    engine = standin()
    await finish_one(engine)
    published = shapes(engine.metrics_text())
    assert published <= shapes(recorded("1.3", "busy"))
    names = {name for name, _ in published}
    assert {
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
        "trtllm_kv_cache_utilization",
    } <= names


async def test_a_stand_in_without_iteration_statistics_never_publishes_the_queue_gauges() -> None:
    engine = standin(gauges_on=False)
    await asyncio.gather(*(finish_one(engine) for _ in range(3)))
    load = parse_load(engine.metrics_text(), trtllm.ENGINE.metrics, "trtllm")
    assert not load.queue_reported and load.prompt_tokens_total == 9
