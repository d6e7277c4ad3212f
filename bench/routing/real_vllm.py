"""The routing benchmark on real vLLM: its CPU build serving SmolLM2-135M-Instruct (``--engine vllm``).

Two (``--replicas``) replicas of vLLM's CPU build (``make vllm``), started with
llmgw's own command line and environment for a replica with KV events
(:data:`llmgw.engines.vllm.ENGINE`), the model as safetensors
(:func:`llmgw.testing.training_base.smollm2_base`), the compile cache in
``<cache>/vllm`` (``VLLM_CACHE_ROOT``) and each KV cache capped with
``--num-gpu-blocks-override``. They are started once: ``VLLM_SERVER_DEV_MODE=1``
gives them ``POST /reset_prefix_cache``, which empties each cache between
policies, and the engines' own counters are read as deltas.

The pure parts (sizing the cache, the best hit rate over the engine's own
tokens, the workload's words) are tested in ``tests/bench``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser()
START_S = 900.0
"""Two replicas starting at once on two cores (about 1-2 minutes with the compile cache kept)."""
CTX_SIZE = 768
"""``--max-model-len``: vLLM refuses to start unless its cache holds one sequence this long."""
CPU_BLOCK_SIZE = 128
"""Tokens per KV block of vLLM's CPU attention (its default): the cache is sized in it before the start;
the engines' own figure (``vllm:cache_config_info``, their KV events) is checked after."""
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
_WORD = re.compile(r"Ġ[a-z]{3,}")
"""A byte-level BPE token that is a space and a lowercase word: one token wherever it stands."""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_healthy(
    port: int,
    timeout_s: float,
    what: str,
    logs: Path,
    proc: subprocess.Popen[bytes] | None = None,
    interval_s: float = 0.05,
) -> None:
    """Until ``GET /health`` on ``port`` answers 200; RuntimeError naming ``what`` and ``logs`` when it
    does not within ``timeout_s``, or when ``proc`` (the server's process) exits first."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; see {logs}")
            try:
                async with http.get(f"http://127.0.0.1:{port}/health") as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not serve within {timeout_s:.0f} s; see {logs}")
            await asyncio.sleep(interval_s)


def vocabulary_words(tokenizer_json: str, count: int = 5000) -> list[str]:
    """``count`` words that are each one token of the model's tokenizer (after a space), so a
    prompt of N such words is about N tokens: the workload is sized in the engine's tokens."""
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    words = sorted((t[1:] for t in vocab if _WORD.fullmatch(t)), key=lambda w: vocab["Ġ" + w])
    if len(words) < count:
        raise ValueError(f"the tokenizer has only {len(words)} one-token words; {count} asked")
    return words[:count]


def cache_blocks(hot_tokens: list[int], block_size: int, fill: float, replicas: int, ctx_size: int) -> int:
    """KV blocks per replica so the hot prefixes (each group's system prompt, ``hot_tokens`` each)
    fill ``fill`` of all the replicas' caches together; never fewer than vLLM starts with: one
    sequence of ``ctx_size`` tokens and the null block its pool keeps."""
    hot = sum(tokens // block_size for tokens in hot_tokens)
    return max(-(-ctx_size // block_size) + 1, round(hot / fill / replicas))


def shared_blocks(prompts: list[list[int]], groups: list[int], block_size: int) -> int:
    """The hot prefixes' blocks: per group, the full blocks every one of its prompts starts with."""
    common: dict[int, list[int]] = {}
    for tokens, group in zip(prompts, groups, strict=True):
        held = common.setdefault(group, tokens)
        length = 0
        for a, b in zip(held, tokens, strict=False):
            if a != b:
                break
            length += 1
        common[group] = held[:length]
    return sum(len(tokens) // block_size for tokens in common.values())


def best_hit_rate(prompts: list[list[int]], block_size: int, primed: int = 0) -> float:
    """The engines' hit ratio (cached prompt tokens over prompt tokens) with one unbounded cache:
    every full block seen before, in a chain from the prompt's start, is a hit. As vLLM, a block
    holding the prompt's last token is never a hit (that token is always computed). The first
    ``primed`` prompts are seen but not counted (the benchmark's primes)."""
    seen: set[int] = set()
    hits = total = 0
    for index, tokens in enumerate(prompts):
        if index == primed:
            hits = total = 0
        total += len(tokens)
        parent = 0
        for start in range(0, len(tokens) - 1 - block_size + 1, block_size):
            parent = hash((parent, tuple(tokens[start : start + block_size])))
            if parent in seen:
                hits += block_size
            else:
                seen.add(parent)
    return hits / total if total else 0.0


def workload_minutes(requests: int, rates: list[float], policies: int, drain_s: float) -> float:
    """The load phases' length: each policy sends every request at each rate (Poisson, so about
    ``requests / rate`` seconds) and waits ``drain_s`` for the last answers."""
    return sum(policies * (requests / rate + drain_s) for rate in rates) / 60


@dataclass
class Engine:
    """What starting real vLLM needs, found in the cache."""

    program: Path
    weights: Path
    version: str

    @classmethod
    def find(cls, cache: Path = CACHE) -> Engine:
        from llmgw.cli.up import bundled_model
        from llmgw.engines import pythonbuilds
        from llmgw.testing.training_base import smollm2_base
        from llmgw.training import environment

        build = pythonbuilds.vllm_cpu_build()
        installed = pythonbuilds.installed_python_build(cache, build)
        python = environment.installed_python(cache)
        gguf = bundled_model()
        if installed is None or python is None or gguf is None:
            raise SystemExit(
                "run 'make vllm training' first: the vLLM CPU build and the training environment"
            )
        return cls(installed.program, smollm2_base(cache, python, gguf), build.version)


class VllmReplicas:
    """Real vLLM replicas, started once, each with a capped KV cache and KV events with replay."""

    def __init__(self, engine: Engine, count: int, blocks: int, seqs: int, key: str, model: str, logs: Path):
        self.engine, self.count, self.blocks, self.seqs = engine, count, blocks, seqs
        self.key, self.model, self.logs = key, model, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.event_ports: list[int] = []
        self.replay_ports: list[int] = []
        self.block_size = 0
        """Tokens per KV block, as the engines' KV events report it (read by the benchmark's feed)."""
        self.start_s = 0.0
        self._before = dict.fromkeys(COUNTERS, 0.0)

    def launch_argv(self, port: int, events: int, replay: int) -> tuple[list[str], dict[str, str]]:
        from llmgw.engines.engine import Launch
        from llmgw.engines.vllm import ENGINE

        launch = Launch(weights=self.engine.weights, port=port, api_key=self.key, model=self.model,
                        ctx_size=CTX_SIZE, parallel=self.seqs, kv_events_port=events, kv_replay_port=replay,
                        args=("--num-gpu-blocks-override", str(self.blocks)))  # fmt: skip
        env = {**os.environ, **ENGINE.default_environment(launch), **ENGINE.environment(launch)}
        env["VLLM_CACHE_ROOT"] = str(CACHE / "vllm")  # the compile cache the suite keeps
        env["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache between policies
        return ENGINE.command_line(self.engine.program, launch), env

    def _spawn(self) -> None:
        self.ports = [_port() for _ in range(self.count)]
        self.event_ports = [_port() for _ in range(self.count)]
        self.replay_ports = [_port() for _ in range(self.count)]
        for i in range(self.count):
            argv, env = self.launch_argv(self.ports[i], self.event_ports[i], self.replay_ports[i])
            with open(self.logs / f"vllm-{i}.log", "ab") as log:
                # Its own session: stop() signals the engine and the EngineCore and Worker it forks.
                proc = subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
                self.procs.append(proc)

    async def start(self) -> None:
        started = time.monotonic()
        self._spawn()
        for port, proc in zip(self.ports, self.procs, strict=True):
            await wait_healthy(port, START_S, f"vLLM on port {port}", self.logs, proc, interval_s=1.0)
        self.start_s = time.monotonic() - started

    async def cache_info(self) -> list[dict[str, str]]:
        """Each replica's ``vllm:cache_config_info`` labels (``num_gpu_blocks``, ``block_size``, ...)."""
        out = []
        async with aiohttp.ClientSession() as http:
            for port in self.ports:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                found = re.search(r"^vllm:cache_config_info\{(.*)\}", text, re.M)
                out.append(dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) if found else {})
        return out

    async def tokenize(self, prompts: list[str]) -> list[list[int]]:
        """The engine's own tokens for each prompt (a replica's ``/tokenize``, as the gateway asks)."""
        out = []
        async with aiohttp.ClientSession() as http:
            for prompt in prompts:
                body = {"model": self.model, "prompt": prompt}
                async with http.post(f"http://127.0.0.1:{self.ports[0]}/tokenize", json=body) as r:
                    out.append(list((await r.json())["tokens"]))
        return out

    async def complete(self, prompt: str, max_tokens: int = 1) -> None:
        """One completion on every replica, straight to the engine (warms each one's first run)."""
        headers = {"Authorization": f"Bearer {self.key}"}
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            for port in self.ports:
                async with http.post(
                    f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers
                ) as r:
                    r.raise_for_status()

    async def reset_caches(self) -> None:
        """Empty every replica's prefix cache (it fails while blocks are held: then wait and retry)."""
        async with aiohttp.ClientSession() as http:
            for port in self.ports:
                for _ in range(60):
                    async with http.post(f"http://127.0.0.1:{port}/reset_prefix_cache") as r:
                        if r.status == 404:
                            raise RuntimeError(
                                "vLLM has no /reset_prefix_cache: it needs VLLM_SERVER_DEV_MODE=1"
                            )
                        if (await r.json()).get("success"):
                            break
                    await asyncio.sleep(0.5)
                else:
                    raise RuntimeError(f"vLLM on port {port} would not reset its prefix cache")

    async def begin_phase(self) -> None:
        """Empty the caches (the KV feed hears each engine's ``AllBlocksCleared``) and note the counters."""
        await self.reset_caches()
        await asyncio.sleep(0.5)
        await self.mark()

    async def mark(self) -> None:
        """Count the hit ratio from here."""
        self._before = await self.counters()

    async def end_phase(self) -> float:
        """The phase's hit ratio: the engines' cached prompt tokens over prompt tokens, as deltas."""
        after = await self.counters()
        hits, queries = (after[name] - self._before[name] for name in COUNTERS)
        return hits / max(1.0, queries)

    async def counters(self) -> dict[str, float]:
        """The engines' own prefix-cache counters, summed over the replicas."""
        out = dict.fromkeys(COUNTERS, 0.0)
        async with aiohttp.ClientSession() as http:
            for port in self.ports:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                for name in COUNTERS:
                    out[name] += sum(
                        float(v)
                        for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)", text, re.M)
                    )
        return out

    def stop(self) -> None:
        """SIGTERM each engine's session (its EngineCore and Worker children too), then SIGKILL."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left
            except ProcessLookupError:
                pass
            proc.wait()
        self.procs = []
