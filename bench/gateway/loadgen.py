"""A bounded HTTP/1.1 load generator: keep-alive connections on raw asyncio sockets.

Runs in its own process so its CPU is not the measured server's. Each of
``--concurrency`` connections sends the same POST again as soon as the answer
before it has ended, until ``--count`` requests are done or ``--duration``
seconds have passed, whichever comes first. Prints one JSON object:

- ``rps``, ``count``, ``errors`` (non-2xx answers and broken connections),
- ``latency_us``: percentiles of the time from sending to the answer's end,
- for ``--stream``: ``ttft_us`` (sending to the first event) and ``gap_us``
  (time between consecutive events, an event sharing a read with the one
  before counting 0), ``events`` (per answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httptools
import uvloop


def percentiles(values: list[int], points: tuple[float, ...] = (50, 90, 99, 99.9)) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    out = {f"p{p:g}": ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] / 1000 for p in points}
    out["mean"] = sum(ordered) / len(ordered) / 1000
    return out


class Results:
    def __init__(self, count: int, deadline: float, stream: bool) -> None:
        self.left = count
        self.deadline = deadline
        self.stream = stream
        self.latencies: list[int] = []
        self.ttfts: list[int] = []
        self.gaps: list[int] = []
        self.events: list[int] = []
        self.errors = 0
        self.error_sample = ""

    def take(self) -> bool:
        """One more request may start."""
        if self.left <= 0 or time.monotonic() > self.deadline:
            return False
        self.left -= 1
        return True


class Client(asyncio.Protocol):
    """One keep-alive connection sending ``request`` over and over."""

    def __init__(self, request: bytes, results: Results, done: asyncio.Future[None]) -> None:
        self.request = request
        self.results = results
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent = 0
        self.first = 0
        self.last = 0
        self.events = 0
        self.status = 0
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        self.next()

    def next(self) -> None:
        assert self.transport is not None
        if not self.results.take():
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)
            return
        self.first = self.last = self.events = 0
        self.body = []
        self.sent = time.perf_counter_ns()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.fail(f"unparsable answer: {error}")

    def on_status(self, _status: bytes) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.results.stream:
            if self.status >= 300:
                self.body.append(body)
            return
        now = time.perf_counter_ns()
        count = body.count(b"data: ")
        if not count:
            return
        if self.events == 0:
            self.first = now
            self.results.ttfts.append(now - self.sent)
            count -= 1
            self.events = 1
        elif count:
            self.results.gaps.append(now - self.last)
            self.results.gaps.extend([0] * (count - 1))
        self.events += count
        self.last = now

    def on_message_complete(self) -> None:
        results = self.results
        if self.status >= 300:
            results.errors += 1
            results.error_sample = f"HTTP {self.status}: {b''.join(self.body)[:300]!r}"
        else:
            results.latencies.append(time.perf_counter_ns() - self.sent)
            if results.stream:
                results.events.append(self.events)
        if self.parser.should_keep_alive():
            self.next()
        else:
            self.fail("the server closed the connection")

    def fail(self, why: str) -> None:
        self.results.errors += 1
        self.results.error_sample = why
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.results.errors += 1
            self.results.error_sample = f"connection lost: {exc}"
            self.done.set_result(None)


async def run(args: argparse.Namespace, body: bytes) -> dict[str, object]:
    head = (
        f"POST {args.path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\n"
        f"Authorization: Bearer {args.key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    results = Results(args.count, time.monotonic() + args.duration, args.stream)
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    waits = []
    for _ in range(args.concurrency):
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(lambda d=done: Client(request, results, d), args.host, args.port)  # type: ignore[misc]
        waits.append(done)
    await asyncio.wait_for(asyncio.gather(*waits), args.duration + 60)
    elapsed = time.perf_counter() - started
    out: dict[str, object] = {
        "count": len(results.latencies),
        "errors": results.errors,
        "elapsed_s": round(elapsed, 3),
        "rps": round(len(results.latencies) / elapsed, 1),
        "latency_us": percentiles(results.latencies),
    }
    if results.error_sample:
        out["error_sample"] = results.error_sample
    if args.stream:
        out["ttft_us"] = percentiles(results.ttfts)
        out["gap_us"] = percentiles(results.gaps)
        out["events"] = min(results.events) if results.events else 0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--key", default="none")
    parser.add_argument("--body", required=True, help="file holding the request body")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--count", type=int, default=1000, help="most requests to send")
    parser.add_argument("--duration", type=float, default=10.0, help="most seconds to keep sending")
    parser.add_argument("--stream", action="store_true", help="the answers are SSE streams")
    args = parser.parse_args()
    json.dump(uvloop.run(run(args, Path(args.body).read_bytes())), sys.stdout)
    print()


if __name__ == "__main__":
    main()
