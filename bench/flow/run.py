"""Flow control benchmark: an interactive tenant beside a flood on one busy model, FIFO against fair queuing.

One replica: llmgw's vLLM stand-in (``llmgw.testing.vllm_standin``) with
``--max-num-seqs SLOTS``, on its timing model (a prompt token costs
``prefill``, an output token ``decode``; at most SLOTS requests run, the rest
wait in its first-come queue). The timings are the real llama-server's
(``make engine``: SmolLM2-135M on this machine, ``--parallel SLOTS``), measured
at the start of the run from its answers' ``timings`` (prompt and predicted
ms per token, the median of a few requests) unless ``--prefill-ms`` and
``--decode-ms`` are given; the JSON line names which.

Two tenants, two projects, one model:

- **interactive** (project ``chat``): Poisson arrivals at ``--rate`` per
  second, short prompts, streamed; its time to first event is measured;
- **flood** (project ``eval``): ``--flood`` clients each sending long
  requests back to back, marked ``x-llmgw-priority: 0`` (a batch's);
  its answered requests per second are counted.

Phases, each ``--seconds`` long, the gateway in this process (uvicorn):
``unloaded`` (the interactive tenant alone), ``fifo`` (both; every request to
the replica at once: ``gateway.flow.mode: fifo``), ``fair`` (both;
``mode: fair`` with ``reserve_share``), and ``sglang-router`` (both, through
PyPI's Rust router, when its virtualenv is there). The JSON line (last)
names ``interactive_p99_ratio`` (p99 TTFT under the flood with fair queuing
over the unloaded p99) and ``flood_throughput_ratio`` (the flood's
requests/s with fair queuing over FIFO's).

``--engine llamacpp`` runs the same phases on the real llama-server itself
(shorter: ``--seconds 20 --flood 32`` or so on two cores).

    python bench/flow/run.py [--seconds 30] [--flood 200] [--slots 8] [--engine llamacpp] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn

from llmgw.cli.up import bundled_model
from llmgw.core.flowqueue import FlowSettings
from llmgw.core.tenancy import Owner, Place
from llmgw.engines import builds
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.testing.cluster import free_port

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gateway"))
from peers import rust_router_command  # noqa: E402  (the gateway bench's sglang-router command)

MODEL = "bench-flow"
REPLICA_KEY = "replica-key"
CHAT_KEY = "sk-llmgw-bench-flow-chat-0001"
FLOOD_KEY = "sk-llmgw-bench-flow-eval-0001"
CACHE = Path.home() / ".cache/llmgw"
DEFAULT_SGLANG_ROUTER_VENV = Path.home() / ".cache/llmgw/bench/sglang-router-venv"


def words(rng: random.Random, count: int) -> str:
    """A prompt of ``count`` words no other prompt starts with (no prefix-cache hits)."""
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(count))


def measured_timings(slots: int, logs: Path) -> tuple[float, float]:
    """(prefill, decode) ms per token of the real llama-server serving SmolLM2 here."""
    weights, found = bundled_model(), builds.installed(CACHE)
    if weights is None or not found:
        raise SystemExit(
            "no llama-server or SmolLM2 here: run 'make engine' (or give --prefill-ms and --decode-ms)"
        )
    port = free_port()
    argv = [str(found[0].binary), "-m", str(weights), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(slots), "--ctx-size", str(2048 * slots)]  # fmt: skip
    with (logs / "llama-server.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"llama-server did not serve; see {logs / 'llama-server.log'}"
                    ) from None
                time.sleep(0.2)
        rng, prefill, decode = random.Random(7), [], []
        for _ in range(4):
            body = {"messages": [{"role": "user", "content": words(rng, 120)}], "max_tokens": 24}
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=300) as answer:
                timings = json.load(answer)["timings"]
            prefill.append(timings["prompt_per_token_ms"])
            decode.append(timings["predicted_per_token_ms"])
        return statistics.median(prefill[1:]), statistics.median(decode[1:])  # the first warms up
    finally:
        proc.terminate()
        proc.wait(20)


def start_llama_server(slots: int, logs: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The real llama-server serving SmolLM2 as ``MODEL`` with ``slots`` parallel slots."""
    weights, found = bundled_model(), builds.installed(CACHE)
    if weights is None or not found:
        raise SystemExit("no llama-server or SmolLM2 here: run 'make engine'")
    port = free_port()
    argv = [str(found[0].binary), "-m", str(weights), "--host", "127.0.0.1", "--port", str(port),
            "--alias", MODEL, "--api-key", REPLICA_KEY, "--metrics",
            "--parallel", str(slots), "--ctx-size", str(2048 * slots)]  # fmt: skip
    with (logs / "llama-server.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return proc, healthy(proc, port, 120, logs / "llama-server.log")


def healthy(proc: subprocess.Popen[bytes], port: int, timeout_s: float, log: Path) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the replica did not serve; see {log}") from None
            time.sleep(0.1)


def start_replica(
    slots: int, prefill_ms: float, decode_ms: float, logs: Path, engine: str = "standin"
) -> tuple[subprocess.Popen[bytes], int]:
    if engine == "llamacpp":
        return start_llama_server(slots, logs)
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(HERE.parents[1] / "src"),
           "LLMGW_STANDIN_PREFILL_S": str(prefill_ms / 1000), "LLMGW_STANDIN_DECODE_S": str(decode_ms / 1000),
           "LLMGW_STANDIN_STARTUP_S": "0"}  # fmt: skip
    argv = [sys.executable, "-m", "llmgw.testing.vllm_standin", "serve", MODEL, "--host", "127.0.0.1",
            "--port", str(port), "--api-key", REPLICA_KEY, "--max-num-seqs", str(slots),
            "--num-gpu-blocks-override", "100000", "--max-model-len", "16384"]  # fmt: skip
    with (logs / "replica.log").open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, healthy(proc, port, 60, logs / "replica.log")


def gateway_for(flow: FlowSettings, slots: int, port: int, engine: str) -> Gateway:
    gateway = Gateway(GatewaySettings(request_wait_s=5, flow=flow))
    for key_id, secret, owner in (
        ("chat", CHAT_KEY, "project:acme/apps/chat"),
        ("eval", FLOOD_KEY, "project:acme/research/eval"),
    ):
        gateway.keys.add(KeyEntry(key_id, key_id, hash_secret(secret), owner, Place(Owner.parse(owner))))
    gateway.catalog.replace([ModelEntry(MODEL, created=1700000000)])
    endpoint = ReplicaEndpoint(
        "r0",
        MODEL,
        f"http://127.0.0.1:{port}",
        REPLICA_KEY,
        capacity=slots,
        engine="llama.cpp" if engine == "llamacpp" else "vllm",
    )
    gateway.feed.replica_ready(endpoint)
    return gateway


async def ttft(http: aiohttp.ClientSession, url: str, key: str, prompt: str, tokens: int,
               headers: dict[str, str] | None = None) -> float | None:  # fmt: skip
    """Seconds to the stream's first content event; None when it failed."""
    started = time.perf_counter()
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "stream": True}  # fmt: skip
    sent = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=sent) as answer:
        if answer.status != 200:
            await answer.read()
            return None
        first = None
        async for line in answer.content:
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter() - started
        return first


async def phase(
    name: str, url: str, args: argparse.Namespace, flood: bool, keys: tuple[str, str]
) -> dict[str, Any]:
    chat_key, flood_key = keys
    rng = random.Random(11)
    stop_at = time.perf_counter() + args.seconds
    flood_done = flood_failed = 0
    timeout = aiohttp.ClientTimeout(total=args.seconds * 6 + 60)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:

        async def flooding() -> None:
            nonlocal flood_done, flood_failed
            own = random.Random(rng.random())
            while time.perf_counter() < stop_at:
                got = await ttft(http, url, flood_key, words(own, args.flood_words), args.flood_tokens,
                                 {"x-llmgw-priority": "0"})  # fmt: skip
                if time.perf_counter() <= stop_at:
                    flood_done, flood_failed = flood_done + (got is not None), flood_failed + (got is None)

        floods = [asyncio.create_task(flooding()) for _ in range(args.flood if flood else 0)]
        if flood:
            await asyncio.sleep(min(5.0, args.seconds / 4))  # the flood fills the slots first
        asked: list[asyncio.Task[float | None]] = []
        while time.perf_counter() < stop_at:
            asked.append(
                asyncio.create_task(ttft(http, url, chat_key, words(rng, args.chat_words), args.chat_tokens))
            )
            await asyncio.sleep(rng.expovariate(args.rate))
        results = await asyncio.gather(*asked)
        for task in floods:
            task.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
    times = sorted(r for r in results if r is not None)
    figures = {
        "phase": name,
        "interactive": len(results),
        "interactive_failed": len(results) - len(times),
        "ttft_p50_ms": round(1000 * pct(times, 0.5), 1) if times else None,
        "ttft_p99_ms": round(1000 * pct(times, 0.99), 1) if times else None,
        "flood_rps": round(flood_done / args.seconds, 2) if flood else None,  # done within the phase
        "flood_failed": flood_failed,
    }
    print(f"  {json.dumps(figures)}", flush=True)
    return figures


def pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def through_gateway(
    name: str, flow: FlowSettings, port: int, args: argparse.Namespace, flood: bool
) -> dict[str, Any]:
    gateway = gateway_for(flow, args.slots, port, args.engine)
    config = uvicorn.Config(gateway.asgi_app(), host="127.0.0.1", port=free_port(), lifespan="off",
                            log_level="warning", http="httptools")  # fmt: skip
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        return await phase(name, f"http://127.0.0.1:{config.port}", args, flood, (CHAT_KEY, FLOOD_KEY))
    finally:
        server.should_exit = True
        await serving
        await gateway.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description="Flow control: an interactive tenant beside a flood.")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--flood", type=int, default=200, help="flood clients sending back to back")
    parser.add_argument("--slots", type=int, default=8, help="requests the replica runs at once")
    parser.add_argument("--rate", type=float, default=2.0, help="interactive requests per second (Poisson)")
    parser.add_argument("--chat-words", type=int, default=24)
    parser.add_argument("--chat-tokens", type=int, default=8)
    parser.add_argument("--flood-words", type=int, default=200)
    parser.add_argument("--flood-tokens", type=int, default=32)
    parser.add_argument(
        "--reserve-share", type=float, default=0.125, help="fair phase's gateway.flow.reserve_share"
    )
    parser.add_argument(
        "--prefill-ms", type=float, help="per prompt token (default: llama-server's, measured)"
    )
    parser.add_argument(
        "--decode-ms", type=float, help="per output token (default: llama-server's, measured)"
    )
    parser.add_argument("--rust-router-venv", type=Path, default=DEFAULT_SGLANG_ROUTER_VENV)
    parser.add_argument("--engine", choices=("standin", "llamacpp"), default="standin",
                        help="the stand-in on llama-server's timings, or llama-server")  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="short phases and a smaller flood, for a smoke run"
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.flood = 8.0, 40
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-flow-") as tmp:
        logs = Path(tmp)
        if args.engine == "llamacpp":
            prefill_ms = decode_ms = 0.0
            source = "the real llama-server serves every phase (no timing model)"
        elif args.prefill_ms is None or args.decode_ms is None:
            prefill_ms, decode_ms = measured_timings(args.slots, logs)
            build = builds.installed(CACHE)[0].binary.parent.name
            source = (
                f"llama-server {build}, SmolLM2-135M-Instruct Q4_1, --parallel {args.slots}, "
                "measured at the start of this run"
            )
        else:
            prefill_ms, decode_ms, source = args.prefill_ms, args.decode_ms, "given on the command line"
        print(
            f"timings: prefill {prefill_ms:.2f} ms/token, decode {decode_ms:.2f} ms/token ({source})",
            flush=True,
        )
        fair = FlowSettings(
            mode="fair", queue_timeout_s=600, queue_max=100_000, reserve_share=args.reserve_share
        )
        phases: dict[str, dict[str, Any]] = {}
        # each phase on a fresh replica: the same prompts find nothing cached from the phase before
        for name, flow, flood in (("unloaded", FlowSettings(), False), ("fifo", FlowSettings(), True),
                                  ("fair", fair, True)):  # fmt: skip
            replica, port = start_replica(args.slots, prefill_ms, decode_ms, logs, args.engine)
            try:
                phases[name] = await through_gateway(name, flow, port, args, flood)
            finally:
                replica.terminate()
                replica.wait(20)
        router_bin = args.rust_router_venv / "bin" / "sglang-router"
        if router_bin.exists():
            replica, port = start_replica(args.slots, prefill_ms, decode_ms, logs, args.engine)
            rport = free_port()
            command = rust_router_command(args.rust_router_venv, rport, port, REPLICA_KEY)
            with (logs / "sglang-router.log").open("wb") as log:
                router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
            try:
                await router_ready(rport)
                phases["sglang-router"] = await phase(
                    "sglang-router", f"http://127.0.0.1:{rport}", args, True, (REPLICA_KEY, REPLICA_KEY)
                )
            finally:
                router.send_signal(signal.SIGTERM)
                router.wait(20)
                replica.terminate()
                replica.wait(20)
    unloaded, fifo, fair_phase = phases["unloaded"], phases["fifo"], phases["fair"]
    line = {
        "timings": {"prefill_ms": round(prefill_ms, 3), "decode_ms": round(decode_ms, 3), "source": source},
        "slots": args.slots, "flood_clients": args.flood, "seconds": args.seconds,
        "phases": phases,
        "interactive_p99_ratio": ratio(fair_phase["ttft_p99_ms"], unloaded["ttft_p99_ms"]),
        "interactive_p99_ratio_fifo": ratio(fifo["ttft_p99_ms"], unloaded["ttft_p99_ms"]),
        "flood_throughput_ratio": ratio(fair_phase["flood_rps"], fifo["flood_rps"]),
    }  # fmt: skip
    if "sglang-router" in phases:
        line["interactive_p99_ratio_sglang_router"] = ratio(
            phases["sglang-router"]["ttft_p99_ms"], unloaded["ttft_p99_ms"]
        )
    print(json.dumps(line), flush=True)
    return 0


async def router_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                headers = {"Authorization": f"Bearer {REPLICA_KEY}"}
                async with http.get(f"http://127.0.0.1:{port}/v1/models", headers=headers) as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sglang-router did not answer within 60 s")
            await asyncio.sleep(0.2)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
