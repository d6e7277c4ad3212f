"""llmgw's SGLang reader against SGLang 0.5.23's metrics as its code writes them; the stand-in held to them.

The recordings in ``data/`` were written from SGLang 0.5.23's own collector
(``python/sglang/srt/observability/metrics_collector.py``, rendered as its
multiprocess registry serves ``/metrics``); each names its source and the
state it shows in its first lines. ``idle`` is one GPU after the server's
start-up warmup; ``busy`` is ``--tp-size 2 --pp-size 2`` on one node, where
the scheduler of TP rank 0 of each pipeline stage reports the same requests.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.engines import prometheus
from llmgw.engines.engine import EngineLoad, parse_load
from llmgw.engines.sglang import ENGINE
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app
from llmgw.testing.eventually import eventually
from llmgw.testing.sglang_standin import IMITATES

from .conftest import Serve

DATA = Path(__file__).parent / "data"
VERSION = "0.5.23"


def recorded(state: str) -> str:
    return (DATA / f"sglang-{VERSION}-metrics-{state}.txt").read_text()


def families(text: str) -> dict[str, Any]:
    """The text read apart from llmgw's parser, by prometheus_client's."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def shapes(text: str) -> dict[str, set[tuple[str, ...]]]:
    """Each sample name's label names (values vary: model, ranks, process ids)."""
    found: dict[str, set[tuple[str, ...]]] = {}
    for sample in prometheus.parse(text):
        found.setdefault(sample.name, set()).add(tuple(sorted(key for key, _ in sample.labels)))
    return found


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_the_recordings_name_their_source_its_version_and_how_they_were_written(state: str) -> None:
    head = recorded(state).splitlines()[:3]
    assert head[0].startswith("# source: github.com/sgl-project/sglang")
    assert "metrics_collector.py at release v0.5.23" in head[0]
    assert "not captured from a running server" in head[2]


def test_an_idle_sglang_reads_as_no_requests_with_its_warmup_counted() -> None:
    text = recorded("idle")
    assert parse_load(text, ENGINE.metrics, "sglang") == EngineLoad(
        running=0, waiting=0, kv_cache_usage=0.0, prompt_tokens_total=6, generated_tokens_total=8
    )
    prompt = families(text)["sglang:prompt_tokens"].samples
    assert [s.value for s in prompt] == [6.0] and prompt[0].labels["is_streaming"] == "false"


def test_a_busy_sglang_counts_the_requests_its_pipeline_stages_share_once() -> None:
    text = recorded("busy")
    running = [s for s in families(text)["sglang:num_running_reqs"].samples]
    assert sorted(s.labels["pp_rank"] for s in running) == ["0", "1"] and {s.value for s in running} == {5.0}
    load = parse_load(text, ENGINE.metrics, "sglang")
    assert (load.running, load.waiting) == (5, 3)  # not 10 and 6: both stages hold the same requests
    assert load.kv_cache_usage == 0.41  # the fuller stage's pool
    streamed = {s.labels["is_streaming"]: s.value for s in families(text)["sglang:prompt_tokens"].samples}
    assert load.prompt_tokens_total == int(sum(streamed.values())) == 4614  # streamed and not, summed
    assert load.generated_tokens_total == 456


def with_priorities(text: str) -> str:
    """``text`` as a server with ``--enable-priority-scheduling`` publishes it: every scheduler series
    carries ``priority``, the total under ``priority=""`` and each priority's share under its number
    (``_log_gauge_queue_count``)."""
    lines = []
    for line in text.splitlines():
        if "tp_rank=" not in line or line.startswith("#"):
            lines.append(line)
            continue
        total = re.sub(r'model_name="([^"]*)"', r'model_name="\1",priority=""', line)
        lines.append(total)
        if line.startswith(("sglang:num_running_reqs{", "sglang:num_queue_reqs{")):
            for priority, share in (("0", 2.0), ("10", 1.0)):
                part = total.replace('priority=""', f'priority="{priority}"')
                lines.append(part.rsplit(" ", 1)[0] + f" {share}")
    return "\n".join(lines) + "\n"


def test_per_priority_shares_are_not_counted_again_beside_their_total() -> None:
    text = with_priorities(recorded("busy"))
    assert len(families(text)["sglang:num_running_reqs"].samples) == 6
    load = parse_load(text, ENGINE.metrics, "sglang")
    assert (load.running, load.waiting) == (5, 3)


def test_every_name_llmgw_reads_is_one_that_version_publishes() -> None:
    published = shapes(recorded("busy"))
    names = ENGINE.metrics
    for field in ("running", "waiting", "kv_cache_usage", "prompt_tokens_total", "generated_tokens_total"):
        wanted = getattr(names, field)
        assert wanted and all(name in published for name in wanted), field


def test_the_stand_in_says_which_version_it_imitates() -> None:
    assert IMITATES == VERSION


def standin(**changes: Any) -> Standin:
    settings = StandinSettings(engine="sglang", served_name="qwen2.5-72b", startup_s=0.0, decode_s=0.0,
                               prefill_s=0.0)  # fmt: skip
    for name, value in changes.items():
        setattr(settings, name, value)
    return Standin(settings)


async def finish(engine: Standin, stream: bool) -> None:
    async for _ in engine.generate([1, 2, 3], 2, stream=stream):
        pass


async def test_the_stand_in_publishes_sglangs_names_types_and_label_keys() -> None:
    engine = standin(pp=2)
    await finish(engine, stream=False)
    await finish(engine, stream=True)
    mine, real = families(engine.metrics_text()), families(recorded("busy"))
    real_shapes = shapes(recorded("busy"))
    for name, family in mine.items():
        assert name in real, f"the stand-in publishes {name}, which SGLang {VERSION} does not"
        assert family.type == real[name].type, name
    for name, keys in shapes(engine.metrics_text()).items():
        assert keys == real_shapes[name], name
    stages = {s.labels["pp_rank"] for s in mine["sglang:num_running_reqs"].samples}
    assert stages == {"0", "1"}  # one series per pipeline stage, as SGLang's schedulers report


async def test_the_stand_ins_shared_requests_read_once_across_its_stages() -> None:
    engine = standin(pp=2, max_running=1)
    gate = asyncio.Event()

    async def slow(_: float) -> None:
        await gate.wait()

    engine.sleep = slow
    tasks = [asyncio.create_task(finish(engine, stream=False)) for _ in range(3)]
    await eventually(lambda: engine.running + engine.waiting == 3, message="three requests in")
    load = parse_load(engine.metrics_text(), ENGINE.metrics, "sglang")
    assert (load.running, load.waiting) == (1, 2)
    gate.set()
    await asyncio.gather(*tasks)
    load = parse_load(engine.metrics_text(), ENGINE.metrics, "sglang")
    assert (load.running, load.waiting, load.prompt_tokens_total, load.generated_tokens_total) == (0, 0, 9, 6)


async def test_the_stand_in_guards_and_takes_salts_as_sglangs_server_does(serve: Serve) -> None:
    """``utils/auth.py``: with a key, only paths starting ``/health``, ``/ready`` or ``/metrics`` go
    unasked; ``entrypoints/openai/protocol.py``: ``cache_salt`` is any string, empty included."""
    engine = standin(api_key="k", startup_s=0.0)
    url = await serve(build_app(engine))
    async with aiohttp.ClientSession() as client:
        for path in ("/health", "/health_generate", "/ready", "/metrics"):
            async with client.get(url + path) as answer:
                assert answer.status != 401, path
        async with client.get(url + "/v1/models") as answer:
            assert answer.status == 401
        body = {"model": "qwen2.5-72b", "prompt": "hello", "max_tokens": 2, "cache_salt": ""}
        async with client.post(
            url + "/v1/completions", json=body, headers={"Authorization": "Bearer k"}
        ) as answer:
            assert answer.status == 200, await answer.text()
