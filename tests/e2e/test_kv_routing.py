"""The KV path end to end: vLLM stand-ins publish, the agent mirrors and replays, the router routes.

Two replicas of a vLLM stand-in model with ``kv_events`` run on one node. Each
stand-in is told to lose batch 2 on its PUB socket (``LLMGW_STANDIN_KV_LOSE``),
keeping it for replay, so the agent's follower must replay it: without the
replay the mirror would be reset and the router would not know the prompt's
first blocks. A long prompt is sent once, then several times again with a
suffix; the repeats go, by KV blocks, to the replica that served it.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.config import EngineSettings, PythonEngineSettings
from llmgw.testing.block_hashing import block_hash, external, none_hash
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.kv_events_publisher import LOSE_ENV
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

MODEL = "kv-vllm"
PROMPT = " ".join(f"word{i}" for i in range(200))
REPEATS = 4


@pytest.fixture(scope="module")
def kv_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("kv")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        config = b'{"architectures": ["LlamaForCausalLM"]}'
        blob = running.upload(filename="config.json", data=config)
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": MODEL,
                "source": {"sha256": blob["sha256"], "filename": "config.json", "format": "safetensors"},
                "profile": {"engine": "vllm", "ctx_size": 2048, "parallel": 2, "kv_events": True},
                "replicas": {"min": 2, "max": 2},
            },
        )
        running.create_key("tests")
        running.add_node(
            "node1",
            nvidia_smi=str(install_fake_nvidia_smi(home / "smi", [H100_80G, H100_80G])),
            engines=EngineSettings(vllm=PythonEngineSettings(program=str(programs.vllm))),
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(LOSE_ENV, "2")  # the agent's engines inherit it
            running.start_agent("node1")
        yield running


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def _post(url: str, body: dict[str, Any], key: str = "") -> dict[str, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _gateway(cluster: Cluster, name: str, **labels: str) -> float:
    return _samples(cluster.metrics()).get((name, tuple(sorted(labels.items()))), 0.0)


def _engine(replica: dict[str, Any], name: str) -> float:
    """One of a replica's own vLLM counters (read from the stand-in itself, not through llmgw)."""
    samples = _samples(_get(f"http://127.0.0.1:{replica['port']}/metrics"))
    return sum(value for (sample, _), value in samples.items() if sample == name)


def _blocks(replica: dict[str, Any], prompt: str) -> set[int]:
    """The KV blocks vLLM stores for ``prompt``: its tokens hashed as sha256_cbor with PYTHONHASHSEED 0."""
    url = f"http://127.0.0.1:{replica['port']}/tokenize"
    tokens = _post(url, {"model": MODEL, "prompt": prompt})["tokens"]
    root, parent, keys = none_hash("0"), None, set()
    for start in range(0, len(tokens) - 15, 16):
        parent = block_hash(parent, tokens[start : start + 16], root)
        keys.add(external(parent, True))
    return keys


def _index_holds(cluster: Cluster, blocks: int, what: str) -> None:
    """Wait until the gateway's KV index knows ``blocks`` blocks; the logs when it does not."""
    try:
        wait_for(lambda: _gateway(cluster, "llmgw_kv_index_blocks") == blocks, 30, what)
    except AssertionError as error:
        held = _gateway(cluster, "llmgw_kv_index_blocks")
        raise AssertionError(f"{error}: {held:g} of {blocks}\n{cluster.tails(40)}") from None


def test_repeats_of_a_prompt_go_by_kv_blocks_to_the_replica_holding_them(kv_cluster: Cluster) -> None:
    def both_ready() -> list[dict[str, Any]] | None:
        ready = [r for r in kv_cluster.replicas(MODEL) if r["state"] == "ready"]
        return ready if len(ready) == 2 else None

    replicas = wait_for(both_ready, 60, "both replicas are ready")
    prompt_blocks = _blocks(replicas[0], PROMPT)
    assert len(prompt_blocks) >= 10

    def complete(prompt: str) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        _post(f"{kv_cluster.url}/v1/completions", body, kv_cluster.key)

    complete(PROMPT)
    [holder] = [r for r in replicas if _engine(r, "vllm:prompt_tokens_total") > 0]
    [other] = [r for r in replicas if r is not holder]
    # Batch 2 never reached the agent by PUB: only its replay completes the index.
    _index_holds(kv_cluster, len(prompt_blocks), "the gateway's KV index holds the prompt's blocks")
    kv_before = _gateway(kv_cluster, "llmgw_prefix_decisions_total", kind="kv")
    hits_before = _engine(holder, "vllm:prefix_cache_hits_total")
    every_block = set(prompt_blocks)
    for index in range(REPEATS):
        repeat = f"{PROMPT} and again, time {index}."
        complete(repeat)
        every_block |= _blocks(holder, repeat)
    assert _gateway(kv_cluster, "llmgw_prefix_decisions_total", kind="kv") - kv_before == REPEATS
    assert _engine(other, "vllm:prompt_tokens_total") == 0  # every repeat went to the holder
    hits = _engine(holder, "vllm:prefix_cache_hits_total") - hits_before
    assert hits >= REPEATS * 16 * len(prompt_blocks)  # and found the prompt's blocks cached there
    _index_holds(kv_cluster, len(every_block), "the gateway's KV index holds every block the holder stored")
    log = kv_cluster.log("agent-node1").read_text(errors="replace")
    # Batch 2 came by replay: at the gap batch 3 showed, or by the quiet socket's catch-up.
    assert re.search(r"batches [0-2] to \d+ (replayed|caught up by replay)", log), log
    assert "the mirror is reset" not in log
