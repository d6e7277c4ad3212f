"""A stand-in for ``llama-server`` that answers at once: for benchmarks and tests of llmgw's own path.

It takes llama-server's command line (the flags llmgw's agent passes: ``--model``,
``--host``, ``--port``, ``--api-key-file``, ``--alias``, ``--metrics``, ...; others are
accepted and ignored) and speaks the parts of its HTTP API llmgw uses. Its keys
come as llama-server's do: ``--api-key KEY`` (comma-separated), ``LLAMA_API_KEY``,
and ``--api-key-file FNAME`` (one key a line; empty lines and lines starting
with ``#`` skipped; a file that cannot be opened ends it); with none, every
request is served.

- ``GET /health`` without the key: 200 ``{"status":"ok"}``.
- ``GET /metrics`` with the key: llama-server's Prometheus names.
- ``GET /lora-adapters`` with the key: the adapters ``--lora FNAME`` and
  ``--lora-scaled FNAME:SCALE`` loaded at start (each a comma-separated
  list, each file checked to exist), as ``[{"id", "path", "scale"}]``. A
  request's ``lora`` field (``[{"id", "scale"}]``) sets the adapters it is
  answered with, those it leaves out at scale 0; without it, every adapter at
  its start scale. ``GET /slots`` shows the last request's ``lora`` field, as
  sent, in ``params.lora``.
- ``POST /v1/chat/completions`` and ``/v1/completions`` with the key: a fixed
  answer, or with ``"stream": true`` a stream of :data:`STREAM_CHUNKS` content
  events, a usage-only event when ``stream_options.include_usage`` asks for it,
  and ``data: [DONE]``.
- Errors in llama-server's shape: ``{"error": {"code", "message", "type"}}``.

It is a raw asyncio protocol on httptools and uvloop, so it costs far less per
request than any gateway in front of it. ``LLMGW_STANDIN_CHUNK_INTERVAL_MS``
spaces the streamed events (default 0: each event is written as its own chunk,
one loop turn apart). Run it as ``python -m llmgw.testing.llama_server_standin``;
:func:`write_launcher` writes an executable that does, for ``engines.llamacpp.binary``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import httptools
import uvloop

STREAM_CHUNKS = 64
"""Content events in a streamed answer."""

PROMPT_TOKENS = 12
"""Prompt tokens every answer reports."""

_COMPLETION = {
    "id": "chatcmpl-standin",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "standin",
    "system_fingerprint": "b0-standin",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 9, "total_tokens": PROMPT_TOKENS + 9},
}


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "standin",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


WHOLE = json.dumps(_COMPLETION, separators=(",", ":")).encode()
EVENTS = (
    [_event(_chunk({"role": "assistant", "content": "tok0 "}))]
    + [_event(_chunk({"content": f"tok{i} "})) for i in range(1, STREAM_CHUNKS - 1)]
    + [_event(_chunk({"content": f"tok{STREAM_CHUNKS - 1}"}, "stop"))]
)
USAGE_EVENT = _event(
    {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "standin",
        "choices": [],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": STREAM_CHUNKS,
            "total_tokens": PROMPT_TOKENS + STREAM_CHUNKS,
        },
    }
)
DONE = b"data: [DONE]\n\n"


# /v1/responses as llama-server b11434 answers it (tests/engines/data/llamacpp-b11434-responses-*)
_RESPONSE_TEXT = "Hello! How can I help you today?"
_OUTPUT_TEXT = {"type": "output_text", "annotations": [], "logprobs": [], "text": _RESPONSE_TEXT}
_MESSAGE = {"content": [_OUTPUT_TEXT], "id": "msg_standin", "role": "assistant", "status": "completed",
            "type": "message"}  # fmt: skip
_RESPONSE_USAGE = {"input_tokens": PROMPT_TOKENS, "output_tokens": 9, "total_tokens": PROMPT_TOKENS + 9,
                   "input_tokens_details": {"cached_tokens": 0}}  # fmt: skip
_RESPONSE = {
    "completed_at": 1700000000, "created_at": 1700000000, "id": "resp_standin", "model": "standin",
    "object": "response", "output": [_MESSAGE], "status": "completed", "usage": _RESPONSE_USAGE,
}  # fmt: skip
RESPONSE_WHOLE = json.dumps(_RESPONSE, separators=(",", ":")).encode()


def _named(name: str, data: dict[str, Any]) -> bytes:
    return (
        f"event: {name}\ndata: ".encode()
        + json.dumps({"type": name, **data}, separators=(",", ":")).encode()
        + b"\n\n"
    )


_STARTED = {"id": "resp_standin", "object": "response", "status": "in_progress"}
_WORDS = ("Hello!", " How", " can", " I", " help", " you", " today?")
RESPONSE_EVENTS = (
    _named("response.created", {"response": _STARTED}),
    _named("response.in_progress", {"response": _STARTED}),
    _named(
        "response.output_item.added",
        {
            "item": {
                "content": [],
                "id": "msg_standin",
                "role": "assistant",
                "status": "in_progress",
                "type": "message",
            }
        },
    ),
    _named(
        "response.content_part.added", {"item_id": "msg_standin", "part": {"type": "output_text", "text": ""}}
    ),
    *(_named("response.output_text.delta", {"item_id": "msg_standin", "delta": word}) for word in _WORDS),
    _named("response.output_text.done", {"item_id": "msg_standin", "text": _RESPONSE_TEXT}),
    _named("response.content_part.done", {"item_id": "msg_standin", "part": _OUTPUT_TEXT}),
    _named("response.output_item.done", {"item": _MESSAGE}),
    _named("response.completed", {"response": _RESPONSE}),
)


def _untyped_item(request: dict[str, Any]) -> bool:
    """Whether the input holds an assistant message without its type, which b11434 refuses."""
    items = request.get("input")
    return isinstance(items, list) and any(
        isinstance(item, dict) and "type" not in item and item.get("role") == "assistant" for item in items
    )


def _framed(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _error(status: int, message: str, type_: str) -> tuple[int, bytes]:
    body = {"error": {"code": status, "message": message, "type": type_}}
    return status, json.dumps(body).encode()


_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 500: b"Server Error"}


class _Connection(asyncio.Protocol):
    """One client connection; requests on it are answered in order."""

    def __init__(self, server: StandIn) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._auth = b""
        self._body: list[bytes] = []
        self._streaming: asyncio.Task[None] | None = None

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._streaming is not None:
            self._streaming.cancel()

    # httptools
    def on_message_begin(self) -> None:
        self._url = b""
        self._auth = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self._auth = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        path = self._url.split(b"?", 1)[0]
        keep_alive = self._parser.should_keep_alive()
        if method == b"GET" and path == b"/health":
            self._reply(200, b'{"status":"ok"}', keep_alive)
            return
        if self._server.authorizations and self._auth not in self._server.authorizations:
            self._reply(*_error(401, "Invalid API Key", "authentication_error"), keep_alive)
            return
        if method == b"GET" and path == b"/metrics":
            self._reply(200, self._server.metrics(), keep_alive, b"text/plain; version=0.0.4")
        elif method == b"GET" and path == b"/slots":
            slot = {"id": 0, "is_processing": False, "params": {"lora": self._server.last_asked}}
            self._reply(200, json.dumps([slot]).encode(), keep_alive)
        elif method == b"GET" and path == b"/lora-adapters":
            self._reply(200, json.dumps(self._server.adapters()).encode(), keep_alive)
        elif method == b"GET" and path in (b"/v1/models", b"/models"):
            listing = {"object": "list", "data": [{"id": self._server.alias, "object": "model"}]}
            self._reply(200, json.dumps(listing).encode(), keep_alive)
        elif method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions", b"/v1/responses"):
            self._complete(b"".join(self._body), keep_alive, responses=path == b"/v1/responses")
        else:
            self._reply(*_error(404, "File Not Found", "not_found_error"), keep_alive)

    def _complete(self, raw: bytes, keep_alive: bool, responses: bool = False) -> None:
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("the request is not a JSON object")
        except ValueError as error:
            self._reply(*_error(500, f"[json.exception.parse_error] {error}", "server_error"), keep_alive)
            return
        if responses and _untyped_item(request):
            self._reply(*_error(400, "Cannot determine type of 'item'", "invalid_request_error"), keep_alive)
            return
        self._server.requests += 1
        self._server.applying(request.get("lora"))
        if request.get("stream") is True:
            options = request.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            events = RESPONSE_EVENTS if responses else (*EVENTS, *((USAGE_EVENT,) if usage else ()), DONE)
            self._streaming = asyncio.get_running_loop().create_task(self._stream(events, keep_alive))
        else:
            self._reply(200, RESPONSE_WHOLE if responses else WHOLE, keep_alive)

    def _reply(self, status: int, body: bytes, keep_alive: bool, kind: bytes = b"application/json") -> None:
        transport = self._transport
        assert transport is not None
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            status,
            _REASONS.get(status, b"Error"),
            kind,
            len(body),
            b"" if keep_alive else b"Connection: close\r\n",
        )
        transport.write(head + body)
        if not keep_alive:
            transport.close()

    async def _stream(self, events: tuple[bytes, ...], keep_alive: bool) -> None:
        """``events`` one chunk each, the generated ones ``interval_s`` apart (the usage event and
        ``[DONE]`` of a chat stream follow its last token at once)."""
        transport = self._transport
        assert transport is not None
        interval = self._server.interval_s
        self._server.running += 1
        tail = [e for e in events[1:] if e is USAGE_EVENT or e is DONE]
        paced = [e for e in events[1:] if e is not USAGE_EVENT and e is not DONE]
        try:
            transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + _framed(events[0])
            )
            for event in paced:
                await asyncio.sleep(interval)
                if transport.is_closing():
                    return
                transport.write(_framed(event))
            transport.write(b"".join(_framed(event) for event in tail) + b"0\r\n\r\n")
            if not keep_alive:
                transport.close()
        finally:
            self._server.running -= 1
            self._streaming = None


class StandIn:
    """The server: its key, alias and counters."""

    def __init__(
        self,
        api_keys: str | list[str],
        alias: str,
        interval_s: float,
        loras: list[tuple[str, float]] | None = None,
    ) -> None:
        keys = [api_keys] if isinstance(api_keys, str) else api_keys
        self.authorizations = frozenset(b"Bearer " + key.encode() for key in keys if key)
        """What a request's Authorization header must be (any may); empty: no key demanded."""
        self.alias = alias
        self.interval_s = interval_s
        self.requests = 0
        self.running = 0
        self.loras = loras or []
        """LoRA adapters loaded at start: (path, scale)."""
        self.last_asked: list[dict[str, Any]] = []
        """The last request's ``lora`` field: ``[{"id", "scale"}]``, empty when it had none."""
        self.last_scales: list[float] = []
        """The scale each adapter was applied at for the last request."""

    def applying(self, asked: Any) -> None:
        """Note the adapters a request is answered with, as llama-server picks them."""
        scales = [scale for _path, scale in self.loras]
        self.last_asked = []
        if isinstance(asked, list) and asked:
            chosen = {int(e.get("id", -1)): float(e.get("scale", 0.0)) for e in asked if isinstance(e, dict)}
            self.last_asked = [{"id": i, "scale": scale} for i, scale in chosen.items()]
            scales = [chosen.get(i, 0.0) for i in range(len(scales))]
        self.last_scales = scales

    def adapters(self) -> list[dict[str, Any]]:
        """``GET /lora-adapters``: each adapter's id, path and scale."""
        return [{"id": i, "path": path, "scale": scale} for i, (path, scale) in enumerate(self.loras)]

    def metrics(self) -> bytes:
        return (
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {self.running}\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            "llamacpp:requests_deferred 0\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {self.requests * PROMPT_TOKENS}\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {self.requests * STREAM_CHUNKS}\n"
        ).encode()


class _Loras(argparse.Action):
    """``--lora`` and ``--lora-scaled`` into one list, in command-line order (an adapter's id)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), (option, values)])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llama-server (llmgw stand-in)",
        description="Answers llama-server's HTTP API at once, for benchmarks and tests; "
        "takes llama-server's flags and ignores those it does not need.",
    )
    parser.add_argument("-m", "--model", default="")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-key", default=os.environ.get("LLAMA_API_KEY", ""))
    parser.add_argument("--api-key-file", default="")
    parser.add_argument("-a", "--alias", default="")
    parser.add_argument("--lora", dest="loras", action=_Loras, default=[])
    parser.add_argument("--lora-scaled", dest="loras", action=_Loras, default=[])
    args, _ignored = parser.parse_known_args(argv)
    if args.model and not Path(args.model).exists():
        parser.error(f"--model {args.model}: no such file; pass the weights' path as llama-server does")
    loras: list[tuple[str, float]] = []
    for option, value in args.loras:
        for item in value.split(","):
            if option == "--lora":
                loras.append((item, 1.0))
                continue
            path, colon, scale = item.partition(":")
            if not colon:
                parser.error(f"--lora-scaled {item}: the format is FNAME:SCALE")
            loras.append((path, float(scale)))
    for path, _scale in loras:
        if not Path(path).is_file():
            parser.error(f"failed to load LoRA adapter {path}: no such file")
    args.loras = loras
    args.api_keys = [key for key in args.api_key.split(",") if key]
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text().split("\n")
        except OSError:
            parser.error(f"error: failed to open file '{args.api_key_file}'")
        args.api_keys += [line for line in lines if line and not line.startswith("#")]
    return args


async def serve(args: argparse.Namespace) -> None:
    interval_s = float(os.environ.get("LLMGW_STANDIN_CHUNK_INTERVAL_MS", "0")) / 1000
    server = StandIn(args.api_keys, args.alias or Path(args.model).name, interval_s, args.loras)
    loop = asyncio.get_running_loop()
    listening = await loop.create_server(lambda: _Connection(server), args.host, args.port, backlog=1024)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"main: server is listening on http://{args.host}:{args.port}", flush=True)
    async with listening:
        await stop.wait()


def write_launcher(path: Path, python: str = sys.executable, chunk_interval_ms: int = 0) -> Path:
    """An executable at ``path`` that runs this stand-in with the arguments it is given
    (``chunk_interval_ms``: its ``LLMGW_STANDIN_CHUNK_INTERVAL_MS``, streams that take their time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A Python script run through its #! line: /proc shows it as ``python PATH args`` and the
    # agent recognises the engine it started after restarting.
    spacing = (
        f"os.environ['LLMGW_STANDIN_CHUNK_INTERVAL_MS'] = '{chunk_interval_ms}'\n"
        if chunk_interval_ms
        else ""
    )
    path.write_text(
        f"#!{python}\nimport os, runpy\n{spacing}"
        "runpy.run_module('llmgw.testing.llama_server_standin', run_name='__main__', alter_sys=True)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def main() -> None:
    uvloop.run(serve(parse_args(sys.argv[1:])))


if __name__ == "__main__":
    main()
