"""The state of a vLLM, SGLang or TensorRT-LLM stand-in: its settings, block cache, queue and counters.

Tokens are produced on a timing model instead of a GPU:

- a prompt costs ``prefill_s`` per token not already in the block cache, and
  each generated token ``decode_s``;
- the block cache holds ``num_blocks`` blocks of ``block_size`` tokens, keyed
  by a hash chained over the prompt's full blocks (as vLLM's prefix cache),
  evicting the least recently used;
- at most ``max_running`` requests run at once; the rest wait (the queue the
  metrics report).

The timing knobs come from ``LLMGW_STANDIN_*`` variables in the stand-in's
environment (the agent passes its own environment on), never from flags: a
stand-in takes exactly its engine's flags. The routes that serve this state are
``engine_standin``'s and ``standin_tasks``'s; both build on this module.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

_WORD = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[int]:
    """A stable stand-in tokenizer: words and punctuation, each to an id below 32000."""
    return [zlib.crc32(piece.encode()) % 32000 for piece in _WORD.findall(text)]


def render_chat(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    """The prompt a chat template makes of ``messages``; ``tools`` go first, in a system turn of
    their own, as chat templates put the tools a request offers ahead of its conversation."""
    parts = [f"<|system|> Tools: {json.dumps(tools, sort_keys=True)}"] if tools else []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|{message.get('role', 'user')}|> {content}")
    return "\n".join(parts) + "\n<|assistant|>"


@dataclass
class StandinSettings:
    """What a stand-in was started with (from its engine's flags and the LLMGW_STANDIN_* variables)."""

    engine: str
    """``vllm``, ``sglang`` or ``trtllm``: which names and routes it speaks."""
    served_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""
    max_running: int = 256
    max_model_len: int = 4096
    block_size: int = 16
    num_blocks: int = 512
    metrics_path: str = "/metrics"
    tasks: frozenset[str] = frozenset({"chat"})
    """What it serves (``chat``, ``embeddings``, ``rerank``), from its engine's flags (standin_tasks)."""
    pp: int = 1
    """SGLang: pipeline stages, each of whose schedulers publishes its gauges (``--pp-size``)."""
    metrics_on: bool = True
    """False where the engine was not told to publish (SGLang without --enable-metrics)."""
    gauges_on: bool = True
    """TensorRT-LLM: queue and cache gauges need enable_iter_perf_stats."""
    max_loras: int = 0
    """vLLM: adapter slots (0: runtime LoRA off)."""
    runtime_lora: bool = False
    """vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING was set."""
    static_loras: dict[str, str] = field(default_factory=dict)
    """vLLM: adapters registered at start (``--lora-modules name=path``), by name."""
    lora_paths_checked: bool = False
    """vLLM: a runtime load's ``lora_path`` must be a PEFT folder, as the real engine reads it."""
    prefill_s: float = field(
        default_factory=lambda: float(os.environ.get("LLMGW_STANDIN_PREFILL_S", "0.0002"))
    )
    """Seconds per uncached prompt token."""
    decode_s: float = field(default_factory=lambda: float(os.environ.get("LLMGW_STANDIN_DECODE_S", "0.002")))
    """Seconds per generated token."""
    load_delay_s: float = field(
        default_factory=lambda: float(os.environ.get("LLMGW_STANDIN_LORA_LOAD_S", "0.05"))
    )
    """Seconds a runtime LoRA load takes."""
    hash_block: Callable[[bytes | None, list[int]], bytes] | None = None
    """vLLM: how blocks are hashed (``--prefix-caching-hash-algo sha256_cbor``); None: a plain chain."""
    hash_salted: Callable[[list[int], str], bytes] | None = None
    """vLLM: how the first block of a request with a ``cache_salt`` is hashed; None: a plain hash."""
    startup_s: float = field(default_factory=lambda: float(os.environ.get("LLMGW_STANDIN_STARTUP_S", "0.2")))
    """Seconds /health answers 503 after start (weights loading)."""


def _plain_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    return hashlib.sha256((parent or b"") + json.dumps(tokens).encode()).digest()


def _plain_salted(tokens: list[int], salt: str) -> bytes:
    return hashlib.sha256(json.dumps([salt, tokens]).encode()).digest()


class BlockCache:
    """A fixed number of KV blocks, keyed by chained block hashes, evicting the least recently used.

    As in vLLM, the blocks of a sequence age tail first: the first block of a
    prompt is the last of its blocks to be evicted.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        hash_block: Callable[[bytes | None, list[int]], bytes] | None = None,
        hash_salted: Callable[[list[int], str], bytes] | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_block = hash_block or _plain_hash
        self.hash_salted = hash_salted or _plain_salted
        """How the first block of a salted request is named (its salt mixed in, as vLLM does)."""
        """How a block is named from its parent's name and its tokens (vLLM's sha256_cbor where asked)."""
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.on_stored: Callable[[list[bytes], bytes | None, list[int], str], None] = lambda *a: None
        """Blocks stored: their hashes, their parent's, their tokens, and the salt of a salted first block."""
        self.on_removed: Callable[[list[bytes]], None] = lambda hashes: None

    def hashes(self, tokens: list[int], salt: str = "") -> list[bytes]:
        chain: list[bytes] = []
        parent: bytes | None = None
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            block = tokens[start : start + self.block_size]
            parent = self.hash_salted(block, salt) if salt and not start else self.hash_block(parent, block)
            chain.append(parent)
        return chain

    def _touch(self, chain: list[bytes]) -> None:
        """Make ``chain``'s held blocks the most recently used, its first block last of all.

        vLLM frees a finished request's blocks tail first, so when the cache
        is full the end of a sequence is evicted before its start and a
        shared prefix outlives the turns built on it.
        """
        for digest in reversed(chain):
            if digest in self._blocks:
                self._blocks.move_to_end(digest)

    def cached_prefix(self, tokens: list[int], salt: str = "") -> int:
        """Tokens at the start of ``tokens`` whose blocks are cached (and now recently used)."""
        held: list[bytes] = []
        for digest in self.hashes(tokens, salt):
            if digest not in self._blocks:
                break
            held.append(digest)
        self._touch(held)
        return len(held) * self.block_size

    def store(self, tokens: list[int], salt: str = "") -> None:
        chain = self.hashes(tokens, salt)
        self._touch(chain)
        parent: bytes | None = None
        for index, digest in enumerate(chain):
            if digest not in self._blocks:
                while len(self._blocks) >= self.num_blocks:
                    evicted, _ = self._blocks.popitem(last=False)
                    self.on_removed([evicted])
                self._blocks[digest] = None
                block = tokens[index * self.block_size : (index + 1) * self.block_size]
                self.on_stored([digest], parent, block, salt if salt and index == 0 else "")
            parent = digest
        self._touch(chain)

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)


class Standin:
    """The state of one stand-in engine: cache, queue, counters, adapters."""

    def __init__(
        self, settings: StandinSettings, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        self.settings = settings
        self.sleep = sleep
        """How the timing model waits (a seam: tests record the waits instead)."""
        self.cache = BlockCache(
            settings.num_blocks, settings.block_size, settings.hash_block, settings.hash_salted
        )
        self.started = time.monotonic()
        self.slots = asyncio.Semaphore(settings.max_running)
        self.running = 0
        self.waiting = 0
        self.held_blocks = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        """Prompt tokens found in the block cache (vLLM's prefix_cache_hits)."""
        self.generated_tokens = 0
        self.requests = 0
        self.by_stream: dict[bool, list[int]] = {}
        """SGLang: prompt tokens, generated tokens and requests finished, by whether they streamed."""
        self.adapters: OrderedDict[str, str] = OrderedDict(settings.static_loras)
        """Adapters served (name to path), least recently used first."""
        self.lora_loads = 0
        """Runtime adapter loads answered with success."""

    # -- serving ------------------------------------------------------------------------------

    async def generate(self, prompt: list[int], max_tokens: int, salt: str = "", stream: bool = False) -> Any:
        """Yield generated token texts on the timing model, holding a slot while running; ``salt``:
        the request's ``cache_salt`` (its blocks are cached apart); ``stream``: it streams."""
        self.waiting += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        blocks = -(-(len(prompt) + max_tokens) // self.settings.block_size)
        self.held_blocks += blocks
        made = 0
        try:
            cached = self.cache.cached_prefix(prompt, salt)
            await self.sleep(self.settings.prefill_s * (len(prompt) - cached))
            self.cache.store(prompt, salt)
            self.prompt_tokens += len(prompt)
            self.cached_tokens += cached
            for index in range(max_tokens):
                await self.sleep(self.settings.decode_s)
                self.generated_tokens += 1
                made += 1
                yield f" tok{index}"
        finally:
            self.held_blocks -= blocks
            self.running -= 1
            self.requests += 1
            tally = self.by_stream.setdefault(stream, [0, 0, 0])
            tally[0] += len(prompt)
            tally[1] += made
            tally[2] += 1
            self.slots.release()

    # -- metrics ------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        s = self.settings
        usage = min(1.0, self.held_blocks / max(1, s.num_blocks))
        label = f'{{model_name="{s.served_name}"}}'
        if s.engine == "vllm":
            label = f'{{engine="0",model_name="{s.served_name}"}}'
            rows = [
                ("vllm:num_requests_running", "gauge", self.running),
                ("vllm:num_requests_waiting", "gauge", self.waiting),
                ("vllm:kv_cache_usage_perc", "gauge", usage),
                ("vllm:prompt_tokens_total", "counter", self.prompt_tokens),
                ("vllm:prefix_cache_queries_total", "counter", self.prompt_tokens),
                ("vllm:prefix_cache_hits_total", "counter", self.cached_tokens),
                ("vllm:generation_tokens_total", "counter", self.generated_tokens),
            ]
        elif s.engine == "sglang":
            return self._sglang_metrics_text(usage)
        else:
            rows = [
                ("trtllm_prompt_tokens_total", "counter", self.prompt_tokens),
                ("trtllm_generation_tokens_total", "counter", self.generated_tokens),
            ]
            if s.gauges_on:
                rows += [
                    ("trtllm_num_requests_running", "gauge", self.running),
                    ("trtllm_num_requests_waiting", "gauge", self.waiting),
                    ("trtllm_kv_cache_utilization", "gauge", usage),
                ]
        lines = []
        for name, kind, value in rows:
            lines += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
        return "\n".join(lines) + "\n"

    def _sglang_metrics_text(self, usage: float) -> str:
        """As SGLang 0.5.23 publishes them: each pipeline stage's scheduler (TP rank 0) its gauges,
        the tokenizer its counters by whether the request streamed (``tests/engines/data/
        sglang-0.5.23-metrics-*.txt``)."""
        s = self.settings
        model = f'engine_type="unified",model_name="{s.served_name}"'
        lines = []
        for name, value in (
            ("sglang:num_running_reqs", self.running),
            ("sglang:num_queue_reqs", self.waiting),
            ("sglang:token_usage", usage),
        ):
            lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge"]
            for stage in range(s.pp):
                ranks = f'moe_ep_rank="0",pp_rank="{stage}",tp_rank="0"'
                lines.append(f"{name}{{{model},{ranks}}} {float(value)}")
        counters = ("prompt_tokens_total", "generation_tokens_total", "num_requests_total")
        for index, name in enumerate(f"sglang:{counter}" for counter in counters):
            if not self.by_stream:
                continue  # a counter's series appears with the first request it counts
            lines += [f"# HELP {name} {name}", f"# TYPE {name} counter"]
            for stream, tally in sorted(self.by_stream.items()):
                flag = "true" if stream else "false"
                lines.append(f'{name}{{{model},is_streaming="{flag}"}} {float(tally[index])}')
        return "\n".join(lines) + "\n"
