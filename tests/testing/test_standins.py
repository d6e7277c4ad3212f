"""The stand-in engines: their flags, timing model, block cache, LoRA routes and KV events."""

from __future__ import annotations

import hashlib
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio
from aiohttp import web

from llmgw.testing.block_hashing import block_hash, cbor, external, none_hash
from llmgw.testing.engine_standin import BlockCache, Standin, StandinSettings, build_app, tokenize
from llmgw.testing.kv_events_publisher import attach
from llmgw.testing.standin_programs import write_standins


@pytest.mark.parametrize(
    ("program", "args", "says"),
    [
        ("vllm", ["serve", "m", "--bogus"], "unrecognized arguments: --bogus"),
        (
            "python",
            ["-m", "sglang.launch_server", "--model-path", "m", "--bogus"],
            "unrecognized arguments: --bogus",
        ),
        ("trtllm-serve", ["serve", "m", "--bogus"], "No such option: --bogus"),
        ("trtllm-serve", ["serve", "m", "--tp-size", "2"], "No such option: --tp-size"),
    ],
)
def test_unknown_flags_are_refused_as_the_engine_refuses_them(
    tmp_path: Path, program: str, args: list[str], says: str
) -> None:
    programs = write_standins(tmp_path / "bin")  # type: ignore[operator]
    done = subprocess.run(
        [
            str(
                getattr(programs, program.replace("-", "_") if program != "trtllm-serve" else "trtllm_serve")
            ),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert says in done.stderr


def test_the_lru_block_cache_keeps_a_fixed_number_of_blocks() -> None:
    cache = BlockCache(num_blocks=3, block_size=2)
    first, second = [1, 2, 3, 4], [9, 9, 8, 8]
    cache.store(first)
    assert cache.cached_prefix([*first, 5, 6]) == 4
    cache.store(second)  # 4 blocks wanted, 3 held: first's tail block goes, as vLLM evicts tails first
    assert len(cache) == 3
    assert cache.cached_prefix(second) == 4
    assert cache.cached_prefix(first) == 2  # its leading block outlived its tail


def test_a_cache_salt_keeps_the_same_prompt_apart_in_the_block_cache() -> None:
    cache = BlockCache(num_blocks=8, block_size=2)
    prompt = [1, 2, 3, 4]
    cache.store(prompt, salt="kb-a")
    assert cache.cached_prefix(prompt, salt="kb-a") == 4
    assert cache.cached_prefix(prompt, salt="kb-b") == 0
    assert cache.cached_prefix(prompt) == 0


async def test_prefill_is_charged_only_for_uncached_tokens() -> None:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    settings = StandinSettings(engine="vllm", served_name="m", block_size=4, prefill_s=0.01, decode_s=0.001)
    engine = Standin(settings, sleep=record)
    prompt = list(range(10))
    assert [t async for t in engine.generate(prompt, 2)] == [" tok0", " tok1"]
    assert waits == pytest.approx([0.1, 0.001, 0.001])
    waits.clear()
    _ = [t async for t in engine.generate(prompt, 1)]
    assert waits == pytest.approx([0.02, 0.001])  # 8 of 10 tokens in cached blocks
    assert (engine.prompt_tokens, engine.generated_tokens) == (20, 3)


@pytest.fixture
async def vllm_lora() -> AsyncIterator[tuple[str, list[float]]]:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    settings = StandinSettings(
        engine="vllm",
        served_name="m",
        api_key="k",
        startup_s=0,
        max_loras=2,
        runtime_lora=True,
        load_delay_s=0.3,
    )
    runner = web.AppRunner(build_app(Standin(settings, sleep=record)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", waits
    await runner.cleanup()


async def test_runtime_lora_has_slots_and_a_load_delay(vllm_lora: tuple[str, list[float]]) -> None:
    url, waits = vllm_lora
    auth = {"Authorization": "Bearer k"}
    async with aiohttp.ClientSession(headers=auth) as http:

        async def load(name: str) -> tuple[int, str]:
            body = {"lora_name": name, "lora_path": f"/a/{name}"}
            async with http.post(f"{url}/v1/load_lora_adapter", json=body) as answer:
                return answer.status, await answer.text()

        assert (await load("a"))[0] == 200 and (await load("b"))[0] == 200
        assert waits == [0.3, 0.3]
        status, text = await load("c")
        assert status == 400 and "No free LoRA slot" in text
        async with http.get(f"{url}/v1/models") as answer:
            assert [m["id"] for m in (await answer.json())["data"]] == ["m", "a", "b"]
        async with http.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a"}) as answer:
            assert answer.status == 200
        assert (await load("c"))[0] == 200
        body = {"model": "c", "prompt": "hi", "max_tokens": 1}
        async with http.post(f"{url}/v1/completions", json=body) as answer:
            assert answer.status == 200


async def test_tokenize_answers_as_vllm(vllm_lora: tuple[str, list[float]]) -> None:
    url, _ = vllm_lora
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/tokenize", json={"prompt": "a b."}) as answer,
    ):
        assert await answer.json() == {"count": 3, "max_model_len": 4096, "tokens": tokenize("a b.")}


@pytest.mark.parametrize("int_hashes", ["1", "0"])
async def test_kv_events_arrive_over_zmq_as_vllm_sends_them(
    monkeypatch: pytest.MonkeyPatch, int_hashes: str
) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", int_hashes)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = none_hash("0")
    settings = StandinSettings(
        engine="vllm", served_name="m", block_size=2, num_blocks=2, prefill_s=0, decode_s=0,
        hash_block=lambda parent, tokens: block_hash(parent, tokens, root),
    )  # fmt: skip
    engine = Standin(settings)
    publisher = attach(engine, {"endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv-events"})
    context = zmq.asyncio.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    subscriber.bind(f"tcp://127.0.0.1:{port}")  # vLLM connects to a non-wildcard endpoint
    received: list[tuple[int, list[object]]] = []
    try:
        for _ in range(100):  # a PUB socket drops what it sends before its connection is up
            publisher.cleared()
            if await subscriber.poll(50):
                break
        while await subscriber.poll(50):
            await subscriber.recv_multipart()
        _ = [t async for t in engine.generate([1, 2, 3, 4, 5, 6], 1)]  # 3 blocks into 2 slots: one evicted
        for _ in range(4):  # stored, stored, removed (the first block, least recently used), stored
            assert await subscriber.poll(2000)
            _topic, sequence, payload = await subscriber.recv_multipart()
            received.append((int.from_bytes(sequence, "big"), msgpack.unpackb(payload)))
    finally:
        subscriber.close(0)
        context.term()
        publisher.close()
    assert [s for s, _ in received] == sorted(s for s, _ in received)
    events = [event for _, batch in received for event in batch[1]]  # type: ignore[union-attr]
    # Maps tagged by type in an array-like batch, as vLLM 0.32 sends them (tests/engines/data).
    assert [e["type"] for e in events] == ["BlockStored", "BlockStored", "BlockRemoved", "BlockStored"]
    first = block_hash(None, [1, 2], root)
    second = block_hash(first, [3, 4], root)
    wanted = external(first, int_hashes == "1")
    stored = {k: events[0][k] for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size")}
    assert stored == {
        "block_hashes": [wanted],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 2,
    }
    assert events[0]["extra_keys"] == [None] and events[0]["lora_id"] is None
    assert (events[1]["block_hashes"], events[1]["parent_block_hash"]) == (
        [external(second, int_hashes == "1")],
        wanted,
    )
    assert events[2] == {"type": "BlockRemoved", "block_hashes": [wanted], "medium": "GPU", "group_idx": 0}


async def test_kv_events_replay_what_the_stand_in_was_told_to_lose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_STANDIN_KV_LOSE", "1,2")
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    settings = StandinSettings(
        engine="vllm", served_name="m", block_size=2, num_blocks=8, prefill_s=0, decode_s=0
    )
    engine = Standin(settings)
    config = {
        "endpoint": f"tcp://*:{ports[0]}",
        "replay_endpoint": f"tcp://*:{ports[1]}",
        "buffer_steps": 3,
    }
    publisher = attach(engine, config)  # a wildcard endpoint: the stand-in binds, as vLLM does
    assert publisher.lost == {1, 2}
    context = zmq.asyncio.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.connect(f"tcp://127.0.0.1:{ports[0]}")
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{ports[1]}")
    try:
        for _ in range(100):
            publisher.cleared()  # sequence 0, then whatever precedes the subscription's arrival
            if await subscriber.poll(50):
                break
        while await subscriber.poll(50):
            await subscriber.recv_multipart()
        start = publisher.sequence
        publisher.lost = {start + 1, start + 2}
        _ = [t async for t in engine.generate([1, 2, 3, 4, 5, 6, 7, 8], 1)]  # four blocks stored
        seen = []
        while await subscriber.poll(200):
            seen.append(int.from_bytes((await subscriber.recv_multipart())[1], "big"))
        assert seen == [start, start + 3]
        await dealer.send_multipart([b"", (start + 1).to_bytes(8, "big")])
        replayed = []
        while True:
            assert await dealer.poll(5000)
            _, sequence, payload = await dealer.recv_multipart()
            if sequence == (-1).to_bytes(8, "big", signed=True):
                break
            replayed.append((int.from_bytes(sequence, "big"), msgpack.unpackb(payload)[1][0]["type"]))
        assert replayed == [
            (start + 1, "BlockStored"),
            (start + 2, "BlockStored"),
            (start + 3, "BlockStored"),
        ]
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])  # older than the 3 kept
        assert await dealer.poll(5000)
        assert int.from_bytes((await dealer.recv_multipart())[1], "big") == start + 1
    finally:
        subscriber.close(0)
        dealer.close(0)
        context.term()
        publisher.close()


def test_canonical_cbor_and_vllm_block_hashes() -> None:
    assert cbor((b"ab", (1, 500, -2), None)) == bytes.fromhex("83 426162 83 01 1901f4 21 f6".replace(" ", ""))
    assert none_hash("0") == hashlib.sha256(b"\x61\x30").digest()  # the text "0"
    root = none_hash("0")
    assert block_hash(None, [7, 8], root) == hashlib.sha256(cbor((root, (7, 8), None))).digest()
    digest = bytes(range(32))
    assert external(digest, True) == int.from_bytes(bytes(range(24, 32)), "big")
