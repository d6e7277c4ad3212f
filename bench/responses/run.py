"""Kept responses benchmark: what keeping responses in the store adds to a Responses request.

Two gateways in this process, each on the same in-process engine double
(``llmgw.testing.gateway_doubles.MemoryEngine`` behind a ``MemoryUpstream``:
no socket, the engine answers at once, as a llama.cpp replica serving the
Responses API), one keeping responses in its own memory (``ResponseStore``),
the other in a store (``StoreResponseBook`` on ``store.responses``: SQLite
in a temporary folder, or ``--store-url``). Each request is one ASGI call
of the gateway, timed from the call to its last body message.

In the same run, alternating between the two gateways request by request
(so drift on the machine falls on both), after a warm-up:

- **plain**: a non-streamed ``POST /v1/responses`` (one keep);
- **follow_up**: the same naming the plain request answered just before as
  its ``previous_response_id`` (a second turn: one read, one keep).

Every request is sent with one key, so past ``gateway.responses_per_key``
(1000) each keep also trims that key's oldest. Prints a table, then one JSON
line of figures: p50 and p99 of each gateway, the added p50/p99 (store
minus memory, in ms) and their ratios; the goal is under 1 ms added at p50
on SQLite for a plain request.

    python bench/responses/run.py [--requests N] [--quick] [--store-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmgw.controlplane.serving.responsebook import StoreResponseBook
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.response_store import ResponseBook, ResponseStore
from llmgw.store.database import Store
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream

MODEL = "bench-chat"
SECRET = "sk-bench-responses-0123456789"
GOAL_ADDED_P50_MS = 1.0
"""Most a store may add at p50 to a plain non-streamed request."""


def gateway(upstream: MemoryUpstream, engine: MemoryEngine, book: ResponseBook) -> Gateway:
    gw = Gateway(upstream.settings, upstream=upstream, responses=book)
    gw.keys.add(KeyEntry("key-1", "bench", hash_secret(SECRET), None, Place(Owner.parse("user:bench"))))
    gw.catalog.replace([ModelEntry(MODEL)])
    gw.replicas.set_ready(engine.endpoint_for(MODEL, engine="llama.cpp"))
    return gw


async def call(app: Gateway, body: bytes) -> tuple[float, dict[str, Any]]:
    """One ``POST /v1/responses`` as an ASGI call: its seconds and its answer."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/responses",
        "raw_path": b"/v1/responses",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {SECRET}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("gateway.bench", 80),
    }
    sent = False
    never = asyncio.Event()
    status = 0
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays: no disconnect
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    started = time.perf_counter()
    await app(scope, receive, send)
    elapsed = time.perf_counter() - started
    if status != 200:
        raise SystemExit(f"the gateway answered {status}: {b''.join(parts)[:500]!r}")
    return elapsed, json.loads(b"".join(parts))


def request(previous: str | None = None) -> bytes:
    data: dict[str, Any] = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 16}
    if previous is not None:
        data["previous_response_id"] = previous
    return json.dumps(data).encode()


def quantiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 in ms."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 4), "p99_ms": round(p99 * 1000, 4)}


async def measure(requests: int, warmup: int, store_url: str) -> dict[str, Any]:
    upstream = MemoryUpstream(GatewaySettings())
    engine = upstream.engine(MemoryEngine())
    store = await Store.open(store_url)
    try:
        gateways = {
            "memory": gateway(upstream, engine, ResponseStore()),
            "store": gateway(upstream, engine, StoreResponseBook(store.responses)),
        }
        last: dict[str, str] = {}
        samples: dict[str, dict[str, list[float]]] = {
            name: {"plain": [], "follow_up": []} for name in gateways
        }
        for n in range(warmup + requests):
            order = list(gateways) if n % 2 == 0 else list(reversed(gateways))
            for kind in ("plain", "follow_up"):
                for name in order:
                    previous = last[name] if kind == "follow_up" else None
                    seconds, answer = await call(gateways[name], request(previous))
                    if kind == "plain":
                        last[name] = answer["id"]
                    if n >= warmup:
                        samples[name][kind].append(seconds)
        for gw in gateways.values():
            await gw.close()
        kept = await store.responses.count()
    finally:
        await engine.stop()
        await store.close()
    figures: dict[str, Any] = {
        "requests": requests,
        "store": "sqlite" if store_url.startswith("sqlite") else store_url.split(":", 1)[0],
        "rows_kept": kept,
    }
    for kind in ("plain", "follow_up"):
        memory, stored = quantiles(samples["memory"][kind]), quantiles(samples["store"][kind])
        figures[kind] = {
            "memory": memory,
            "store": stored,
            "added_p50_ms": round(stored["p50_ms"] - memory["p50_ms"], 4),
            "added_p99_ms": round(stored["p99_ms"] - memory["p99_ms"], 4),
            "ratio_p50": round(stored["p50_ms"] / memory["p50_ms"], 3),
            "ratio_p99": round(stored["p99_ms"] / memory["p99_ms"], 3),
        }
    figures["goal_added_p50_ms"] = GOAL_ADDED_P50_MS
    figures["goal_met"] = figures["plain"]["added_p50_ms"] < GOAL_ADDED_P50_MS
    return figures


def table(figures: dict[str, Any]) -> str:
    lines = [f"{'request':<10} {'book':<7} {'p50 ms':>9} {'p99 ms':>9}"]
    for kind in ("plain", "follow_up"):
        for book in ("memory", "store"):
            q = figures[kind][book]
            lines.append(f"{kind:<10} {book:<7} {q['p50_ms']:>9.3f} {q['p99_ms']:>9.3f}")
        row = figures[kind]
        lines.append(
            f"{kind:<10} {'added':<7} {row['added_p50_ms']:>9.3f} {row['added_p99_ms']:>9.3f}"
            f"   (x{row['ratio_p50']} at p50, x{row['ratio_p99']} at p99)"
        )
    goal = "met" if figures["goal_met"] else "NOT met"
    lines.append(f"goal: under {GOAL_ADDED_P50_MS:g} ms added at p50 (plain, {figures['store']}): {goal}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000, help="measured requests of each kind per book")
    parser.add_argument("--quick", action="store_true", help="a tenth of the requests")
    parser.add_argument("--store-url", default="", help="the store to keep responses in (default: SQLite)")
    args = parser.parse_args(argv)
    requests = max(1, args.requests // 10 if args.quick else args.requests)
    warmup = max(1, requests // 10)
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-responses-") as folder:
        url = args.store_url or f"sqlite+aiosqlite:///{Path(folder) / 'store.db'}"
        figures = asyncio.run(measure(requests, warmup, url))
    print(table(figures))
    print(json.dumps(figures, separators=(",", ":")))
    sys.stdout.flush()
    return figures


if __name__ == "__main__":
    main()
