"""What flow control costs a request when nothing queues: ``gateway.flow.mode: fair`` against ``fifo``.

With ``mode: fair`` every request on a replica-served route asks the flow gate
whether its model must queue (:meth:`llmgw.gateway.finding.ReplicaFinder.take_turn`:
its priority header, its key's priority from the limits, whether the model has
a free slot). With the replica's slots free that is the whole cost, and it is
measured two ways in one run, the rounds alternating:

- **the decision alone**: ``take_turn`` on a free model, timed call by call
  (``perf_counter_ns``), its p50 and p99 in microseconds against the goal of
  20 µs p50;
- **whole requests**: the same chat completion through the gateway's ASGI app
  in this process (an in-memory engine behind it, every key limited with a
  priority), CPU time per request with ``fifo`` (the baseline) and ``fair``.

The JSON line (last) names ``decision_p50_us``, ``request_cpu_us_fifo``,
``request_cpu_us_fair`` and ``ratio_fair_cpu`` (fair over fifo).

    python bench/flow/decision.py [--requests 3000] [--calls 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
from typing import Any

from llmgw.core.flowqueue import FlowSettings
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.exchange import Exchange
from llmgw.testing.asgi_client import asgi_client
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream

MODEL = "bench-chat"
SECRET = "sk-llmgw-bench-0123456789"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


async def gateway_of(mode: str) -> tuple[Gateway, MemoryEngine]:
    settings = GatewaySettings(flow=FlowSettings(mode=mode))  # type: ignore[arg-type]
    upstream = MemoryUpstream(settings)
    engine = upstream.engine(MemoryEngine())
    gateway = Gateway(settings, upstream=upstream)
    place = Place(Owner.parse("project:acme/ml/chat"))
    key = KeyEntry("key-1", "bench", hash_secret(SECRET), "project:acme/ml/chat", place)
    gateway.feed.keys_replaced([key])
    gateway.feed.limits_replaced({"project:acme/ml/chat": Limits(priority=7)})
    gateway.catalog.replace([ModelEntry(MODEL)])
    gateway.feed.replica_ready(dataclasses.replace(engine.endpoint, model=MODEL, capacity=64))
    return gateway, engine


def decision_ns(gateway: Gateway, calls: int) -> list[int]:
    """``take_turn`` on a model with free slots, each call timed."""
    exchange = Exchange(b"bench")
    exchange.model = MODEL
    exchange.key = gateway.keys.get("key-1")
    exchange.headers = [(b"content-type", b"application/json"), (b"x-llmgw-priority", b"3")]
    times = []
    clock = time.perf_counter_ns
    finder = gateway.finder
    for _ in range(calls):
        started = clock()
        coroutine = finder.take_turn(exchange)
        try:
            coroutine.send(None)  # a free slot: it returns without awaiting anything
        except StopIteration as done:
            assert done.value is False  # it went at once: nothing queued
        times.append(clock() - started)
    return times


async def request_cpu_us(gateway: Gateway, requests: int) -> float:
    """CPU time per chat completion through the gateway's ASGI app, in microseconds."""
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with asgi_client(gateway.asgi_app(), "http://gateway.bench") as client:
        for _ in range(50):  # warm
            await client.post("/v1/chat/completions", json=BODY, headers=headers)
        started = time.process_time()
        for _ in range(requests):
            answer = await client.post("/v1/chat/completions", json=BODY, headers=headers)
            assert answer.status_code == 200, answer.text
        return (time.process_time() - started) / requests * 1e6


async def run(args: argparse.Namespace) -> dict[str, Any]:
    fifo, fifo_engine = await gateway_of("fifo")
    fair, fair_engine = await gateway_of("fair")
    try:
        cpu: dict[str, list[float]] = {"fifo": [], "fair": []}
        decisions: list[int] = []
        for _ in range(args.rounds):
            cpu["fifo"].append(await request_cpu_us(fifo, args.requests))
            cpu["fair"].append(await request_cpu_us(fair, args.requests))
            decisions += decision_ns(fair, args.calls // args.rounds)
    finally:
        for gateway, engine in ((fifo, fifo_engine), (fair, fair_engine)):
            await engine.stop()
            await gateway.close()
    decisions.sort()
    fifo_us, fair_us = statistics.median(cpu["fifo"]), statistics.median(cpu["fair"])
    p50 = decisions[len(decisions) // 2] / 1000
    return {
        "decision_p50_us": round(p50, 2),
        "decision_p99_us": round(decisions[int(len(decisions) * 0.99)] / 1000, 2),
        "request_cpu_us_fifo": round(fifo_us, 1),
        "request_cpu_us_fair": round(fair_us, 1),
        "ratio_fair_cpu": round(fair_us / fifo_us, 3),
        "goal_decision_p50_us": 20,
        "goal_met": p50 <= 20,
        "rounds": args.rounds,
        "requests_per_round": args.requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="What flow control costs a request when nothing queues.")
    parser.add_argument("--requests", type=int, default=3000, help="whole requests per mode and round")
    parser.add_argument("--calls", type=int, default=200_000, help="decisions timed, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a tenth of the work, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.calls = max(100, args.requests // 10), max(1000, args.calls // 10)
    figures = asyncio.run(run(args))
    print(
        f"decision p50 {figures['decision_p50_us']} µs (p99 {figures['decision_p99_us']} µs); CPU per "
        f"request fifo {figures['request_cpu_us_fifo']} µs, fair {figures['request_cpu_us_fair']} µs"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
