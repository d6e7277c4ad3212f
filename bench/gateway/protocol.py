"""What the HTTP server's protocol costs a request, without sockets: llmgw's against uvicorn's own.

Each protocol is fed, on one kept-alive connection, the bytes of a chat
completion as a client sends them (request line, seven headers, a 160-byte
body), and answers through the same small ASGI app (it reads the body and
sends a JSON answer with the headers the gateway sends). The connection's
transport only counts what is written: what is measured is the protocol's own
Python (parsing callbacks, the scope, the request's cycle and task, the
answer's head and body, the timers) and the event loop's turns for it — the
rows "HTTP server" and part of "event loop" of the c=64 profile
(``bench/gateway/README.md``), with no kernel in the figure.

Two protocols, in alternating rounds on uvloop, CPU time per request:

- ``uvicorn``: uvicorn's ``HttpToolsProtocol`` as it comes (the baseline);
- ``llmgw``: llmgw's server protocol
  (:class:`~llmgw.controlplane.serving.httpserving.GuardedHttpProtocol`: the
  connection guard's timeouts and caps, the held head, the departures).

The JSON line (last) names ``us_uvicorn``, ``us_llmgw`` and
``ratio_llmgw_uvicorn``.

    python bench/gateway/protocol.py [--requests 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from llmgw.controlplane.config import HttpSettings
from llmgw.controlplane.serving.httpserving import ConnectionGuard, guarded_protocol

BODY = json.dumps(
    {"model": "bench-chat", "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\n"
    b"Host: 127.0.0.1:8000\r\n"
    b"User-Agent: bench/1.0\r\n"
    b"Accept: */*\r\n"
    b"Authorization: Bearer llmgw-0123456789abcdef0123456789abcdef\r\n"
    b"Content-Type: application/json\r\n"
    b"X-Request-Id: 7f3c2a\r\n"
    b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)
ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "bench-chat",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }
).encode()
ANSWER_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(ANSWER)).encode()),
    (b"x-request-id", b"7f3c2a"),
    (b"x-llmgw-served-by", b"replica-1"),
]


class CountingTransport(asyncio.Transport):
    """A connection's transport that keeps nothing: counts answers (their bodies' last bytes)."""

    def __init__(self, done: asyncio.Event) -> None:
        super().__init__()
        self._done = done
        self.answers = 0
        self.closed = False

    def _wrote(self, data: bytes) -> None:
        if data.endswith(ANSWER):
            self.answers += 1
            self._done.set()

    def write(self, data: Any) -> None:
        self._wrote(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self._wrote(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return ("127.0.0.1", 8000)
        if name == "peername":
            return ("127.0.0.1", 50000)
        return default


async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The gateway's shape of a whole answer: the body read, then its head and body."""
    message = await receive()
    assert message["body"] == BODY, message
    await send({"type": "http.response.start", "status": 200, "headers": ANSWER_HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def protocols() -> dict[str, type[asyncio.Protocol]]:
    guard = ConnectionGuard(HttpSettings())
    return {"uvicorn": HttpToolsProtocol, "llmgw": guarded_protocol(guard)}


async def cpu_per_request(protocol_class: type[Any], requests: int) -> float:
    """Microseconds of CPU a request, on one kept-alive connection."""
    config = uvicorn.Config(
        answer, lifespan="off", log_level="warning", access_log=False, proxy_headers=False
    )
    config.load()
    state = ServerState()
    done = asyncio.Event()
    transport = CountingTransport(done)
    protocol = protocol_class(config=config, server_state=state, app_state={})
    protocol.connection_made(transport)
    try:
        for _ in range(200):  # warm
            done.clear()
            protocol.data_received(REQUEST)
            await done.wait()
        started = time.process_time()
        for _ in range(requests):
            done.clear()
            protocol.data_received(REQUEST)
            await done.wait()
        spent = time.process_time() - started
    finally:
        protocol.connection_lost(None)
    assert transport.answers == requests + 200, transport.answers
    return spent / requests * 1e6


async def measure(requests: int, rounds: int) -> dict[str, list[float]]:
    made = protocols()
    figures: dict[str, list[float]] = {name: [] for name in made}
    for _ in range(rounds):
        for name, protocol_class in made.items():
            figures[name].append(await cpu_per_request(protocol_class, requests))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per protocol and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the protocols alternating")
    args = parser.parse_args()
    figures = uvloop.run(measure(args.requests, args.rounds))
    result: dict[str, Any] = {}
    for name, runs in figures.items():
        median = statistics.median(runs)
        result[f"us_{name}"] = round(median, 2)
        print(f"{name:10s} {median:7.2f} µs a request (rounds: {', '.join(f'{r:.2f}' for r in runs)})")
    for name in figures:
        if name != "uvicorn":
            result[f"ratio_{name}_uvicorn"] = round(result[f"us_{name}"] / result["us_uvicorn"], 3)
    result["requests"] = args.requests
    result["rounds"] = args.rounds
    print(json.dumps(result))


if __name__ == "__main__":
    main()
