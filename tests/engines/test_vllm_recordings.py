"""llmgw's vLLM readers against what a real vLLM published, and the stand-in held to the same recordings.

The recordings in ``data/`` (``make record-vllm`` takes them again) are vLLM
0.32.0's CPU build serving SmolLM2-135M-Instruct, started with llmgw's own
flags: its ``/metrics`` idle and after requests, and the KV-event batches
its ZMQ publisher sent for a 1,024-token prompt, plain and with a
``cache_salt``. Each file names its source in its first line or field.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgpack
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.kv_events import HashCheck, decode
from llmgw.core.kvblocks import BlockHasher, block_key
from llmgw.engines.engine import parse_load
from llmgw.engines.vllm import ENGINE, HASH_SEED
from llmgw.testing.engine_standin import Standin, StandinSettings
from llmgw.testing.kv_events_publisher import KvEventsPublisher

DATA = Path(__file__).parent / "data"
EVENTS = "vllm-0.32.0-cpu-kv-events.json"


def _text(name: str) -> str:
    return (DATA / name).read_text()


def _recording() -> dict[str, Any]:
    return json.loads(_text(EVENTS))  # type: ignore[no-any-return]


def _payloads() -> list[bytes]:
    return [base64.b64decode(batch["payload"]) for batch in _recording()["batches"]]


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_the_recordings_name_their_source() -> None:
    for name in ("vllm-0.32.0-cpu-metrics-idle.txt", "vllm-0.32.0-cpu-metrics-busy.txt"):
        assert _text(name).startswith("# source: vLLM 0.32.0")
    assert _recording()["source"].startswith("vLLM 0.32.0") and _recording()["version"] == "0.32.0"


def test_the_recorded_metrics_read_as_a_load() -> None:
    idle = parse_load(_text("vllm-0.32.0-cpu-metrics-idle.txt"), ENGINE.metrics, "vllm")
    assert (idle.running, idle.waiting, idle.prompt_tokens_total, idle.generated_tokens_total) == (0, 0, 0, 0)
    busy_text = _text("vllm-0.32.0-cpu-metrics-busy.txt")
    busy = parse_load(busy_text, ENGINE.metrics, "vllm")
    prompt = _families(busy_text)["vllm:prompt_tokens"].samples[0].value  # read apart from llmgw's parser
    assert busy.prompt_tokens_total == int(prompt) > 2000  # two 1,024-token prompts and a chat
    assert busy.kv_cache_usage is not None and 0 <= busy.kv_cache_usage <= 1


def test_the_recorded_engine_stores_blocks_of_128_tokens_which_llmgw_hashes_as_it_does() -> None:
    stored = [details for payload in _payloads() for details in decode(payload).stored]
    assert len(stored) == 2 and {s.block_size for s in stored} == {128}  # vLLM's CPU backend
    plain, salted = stored
    hasher = BlockHasher(HASH_SEED, plain.block_size)
    assert hasher.keys(list(plain.tokens)) == [block_key(h) for h in plain.hashes]
    # The salted request's first block carries its salt as an extra key; llmgw's salted chain
    # (("cache_salt", salt) as vLLM 0.32 tags it) gives the engine's hashes.
    assert salted.extra_keys is not None and salted.extra_keys[0] == ["kb-abc"]
    assert hasher.keys(list(salted.tokens), "kb-abc") == [block_key(h) for h in salted.hashes]
    # Hashed in blocks of 16, as llmgw assumed before it read the size: nothing matches.
    assert not set(BlockHasher(HASH_SEED, 16).keys(list(plain.tokens))) & {block_key(h) for h in plain.hashes}
    check = HashCheck(HASH_SEED)
    for details in stored:
        check.see(details)
    assert check.agreed == 1 and not check.mismatch


def test_the_standins_kv_events_have_the_recorded_shape() -> None:
    recorded = msgpack.unpackb(_payloads()[0], raw=False)
    publisher = KvEventsPublisher("tcp://127.0.0.1:9", "kv-events", block_size=128)
    try:
        publisher.stored([bytes(32)], None, list(range(128)), salt="s")
        [(_, payload)] = list(publisher._buffer)
    finally:
        publisher.close()
    mine = msgpack.unpackb(payload, raw=False)
    assert len(mine) == len(recorded) and isinstance(mine[1][0], dict)
    [recorded_event], [event] = recorded[1], mine[1]
    assert set(event) == set(recorded_event) and event["type"] == recorded_event["type"]
    assert {key: type(value) for key, value in event.items() if value is not None} == {
        key: type(value) for key, value in recorded_event.items() if value is not None
    }
    assert event["extra_keys"] == [["s"]]  # the salt as the real engine lists it


def test_the_standins_metrics_are_named_typed_and_labelled_as_the_real_engines() -> None:
    real = _families(_text("vllm-0.32.0-cpu-metrics-busy.txt"))
    standin = Standin(StandinSettings(engine="vllm", served_name="smol"))
    for name, family in _families(standin.metrics_text()).items():
        assert name in real, f"the stand-in publishes {name}, which vLLM 0.32 does not"
        assert family.type == real[name].type, name
        [sample] = [s for s in family.samples if s.name.endswith(("_total", "")) and s.name.startswith(name)][
            :1
        ]
        real_labels = {label for s in real[name].samples for label in s.labels}
        assert set(sample.labels) <= real_labels, name
