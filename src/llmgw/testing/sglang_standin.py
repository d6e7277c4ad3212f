"""A stand-in for ``python -m sglang.launch_server`` with SGLang's flags, on the timing model.

It imitates SGLang :data:`IMITATES`: its metric names, types and label keys
are those of ``tests/engines/data/sglang-0.5.23-metrics-*.txt``, one series
of each scheduler gauge per pipeline stage (``--pp-size``), as its schedulers
publish them.

Metrics are served only with ``--enable-metrics`` (404 otherwise, as SGLang);
``--max-total-tokens`` sizes the token pool (``sglang:token_usage``).
``--config FILE.yaml`` is read as SGLang's ``ConfigArgumentMerger`` reads it
(one file only, ``.yaml``/``.yml``, a mapping of flag names to values, merged
before the command line's arguments, which win). Like SGLang, it prints
``server_args=ServerArgs(...)`` at start, the API key among them.
With ``--nnodes N`` every node meets at ``--dist-init-addr`` over TCP
(:mod:`llmgw.testing.standin_rendezvous`): rank 0 serves only once all N have
joined and exits when one leaves; the others answer ``/health`` on their own
port and exit when rank 0 goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml
from aiohttp import web

from llmgw.testing import standin_rendezvous
from llmgw.testing.engine_standin import StandinSettings, serve

IMITATES = "0.5.23"
"""The SGLang release whose server this stand-in speaks for."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    add = parser.add_argument
    add("--model-path", required=True)
    add("--tokenizer-path")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--api-key")
    add("--served-model-name")
    add("--tp-size", "--tensor-parallel-size", type=int, default=1)
    add("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", "--nccl-init-addr")
    add("--dp-size", type=int, default=1)
    add("--context-length", type=int)
    add("--max-running-requests", type=int)
    add("--max-total-tokens", type=int)
    add("--page-size", type=int, default=1)
    add("--mem-fraction-static", type=float)
    add("--chunked-prefill-size", type=int)
    add("--schedule-policy", default="fcfs")
    add("--dtype", default="auto")
    add("--kv-cache-dtype", default="auto")
    add("--quantization")
    add("--attention-backend")
    add("--random-seed", type=int)
    add("--trust-remote-code", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--enable-metrics", action="store_true")
    add("--is-embedding", action="store_true")
    add("--enable-cache-report", action="store_true")
    add("--log-level", default="info")
    add("--chat-template")
    add("--tool-call-parser")
    add("--reasoning-parser")
    return parser


def merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with the settings of its ``--config`` file put first, as SGLang merges them.

    ValueError with SGLang's messages for a second ``--config``, a missing
    path, a file that is not YAML or not found, or one that holds no mapping.
    """
    places = [i for i, arg in enumerate(argv) if arg == "--config"]
    if not places:
        return argv
    if len(places) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    at = places[0]
    if at == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    merged: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if key.replace("-", "_") not in store_true:
                merged += [flag, str(value).lower()]
            elif value:
                merged.append(flag)
        elif isinstance(value, list):
            merged += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            merged += [flag, json.dumps(value)]
        else:
            merged += [flag, str(value)]
    return merged + argv[:at] + argv[at + 2 :]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        merged = merge_config(parser, sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        print(f"ValueError: {error}", file=sys.stderr)
        return 1
    options = parser.parse_args(merged)
    fields = ", ".join(f"{name}={value!r}" for name, value in vars(options).items())
    print(f"server_args=ServerArgs({fields})", flush=True)
    max_len = options.context_length or 4096
    settings = StandinSettings(
        engine="sglang",
        served_name=options.served_model_name or options.model_path,
        host=options.host,
        port=options.port,
        api_key=options.api_key or "",
        max_running=options.max_running_requests or 256,
        max_model_len=max_len,
        block_size=options.page_size,
        num_blocks=options.max_total_tokens or 8 * max_len,
        metrics_on=options.enable_metrics,
        pp=options.pp_size,
        tasks=frozenset({"embeddings", "rerank"}) if options.is_embedding else frozenset({"chat"}),
    )
    if options.nnodes > 1:
        if not options.dist_init_addr:
            print("ValueError: --dist-init-addr is required with --nnodes above 1", file=sys.stderr)
            return 1
        if options.node_rank > 0:
            standin_rendezvous.join(options.dist_init_addr, 1, f"sglang node rank {options.node_rank}")
            serve_health(options.host, options.port)  # as SGLang's launch_dummy_health_check_server
            return 0
        port = int(options.dist_init_addr.rpartition(":")[2])
        cluster = standin_rendezvous.Cluster(port, own=1)
        cluster.wait_for(options.nnodes, on_short=lambda: _lost(options.nnodes))
        print(f"INFO: all {options.nnodes} nodes joined at {options.dist_init_addr}", flush=True)
    serve(settings)
    return 0


def _lost(nnodes: int) -> None:
    print(f"ERROR: a node of the {nnodes} left the distributed group; exiting", file=sys.stderr, flush=True)
    os._exit(1)


def serve_health(host: str, port: int) -> None:
    """A node of rank 1 and above: ``/health`` and ``/health_generate`` only, 200 while it runs."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_get("/health_generate", ok)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    sys.exit(main())
