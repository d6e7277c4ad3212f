"""llmgw's launcher for ``trtllm-serve``: the replica's key in front, Prometheus metrics on.

``python -m llmgw.engines.trtllm_launcher --trtllm-serve PATH --host H --port P -- serve MODEL …``

It refuses to start without the replica's key (``LLMGW_REPLICA_KEY``), writes
an options file turning on the metrics the router reads, starts trtllm-serve
on a private loopback port (without the key in its environment: it has no use
for it), and answers ``H:P`` itself: ``/health`` for
anyone, everything else only with ``Authorization: Bearer <key>``, relayed as
it streams. It ends when trtllm-serve ends (with its exit code) and passes
SIGTERM on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from llmgw.engines.trtllm import KEY_VARIABLE, OPTIONS

OPTIONS_FILE = "trtllm-options.yaml"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "authorization"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _proxy(key: str, upstream: str, client: aiohttp.ClientSession) -> web.Application:
    async def relay(request: web.Request) -> web.StreamResponse:
        if request.path != "/health":
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), key.encode()):
                return web.json_response(
                    {"error": {"message": "invalid API key", "type": "authentication_error", "code": 401}},
                    status=401,
                )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        try:
            async with client.request(
                request.method, upstream + request.path_qs, headers=headers, data=await request.read()
            ) as answer:
                response = web.StreamResponse(
                    status=answer.status,
                    headers={k: v for k, v in answer.headers.items() if k.lower() not in _HOP},
                )
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError:
            return web.json_response({"error": {"message": "trtllm-serve is not answering yet"}}, status=503)

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


async def _run(options: argparse.Namespace, serve_args: list[str], key: str) -> int:
    inner = _free_port()
    child = await asyncio.create_subprocess_exec(
        options.trtllm_serve,
        *serve_args,
        "--host", "127.0.0.1",
        "--port", str(inner),
        "--extra_llm_api_options", OPTIONS_FILE,
        env={name: value for name, value in os.environ.items() if name != KEY_VARIABLE},
    )  # fmt: skip
    loop = asyncio.get_running_loop()

    def pass_on(signum: int) -> None:
        if child.returncode is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, pass_on, signum)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)) as client:
        runner = web.AppRunner(_proxy(key, f"http://127.0.0.1:{inner}", client), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, options.host, options.port).start()
            return await child.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                if child.returncode is None:
                    child.kill()
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, serve_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(prog="python -m llmgw.engines.trtllm_launcher", description=__doc__)
    parser.add_argument("--trtllm-serve", required=True, help="trtllm-serve from the operator's environment")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args(ours)
    key = os.environ.get(KEY_VARIABLE, "")
    if not key:
        print(
            f"error: no replica key in {KEY_VARIABLE}; trtllm-serve has no key of its own and is never "
            "started unguarded. Start it through the llmgw agent, which sets the key.",
            file=sys.stderr,
        )
        return 2
    if not serve_args or serve_args[0] != "serve":
        print("error: give trtllm-serve's arguments after --, starting with 'serve MODEL'", file=sys.stderr)
        return 2
    Path(OPTIONS_FILE).write_text(yaml.safe_dump(OPTIONS))
    return asyncio.run(_run(options, serve_args, key))


if __name__ == "__main__":
    sys.exit(main())
