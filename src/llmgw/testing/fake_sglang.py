"""A stand-in for ``python -m sglang.launch_server`` with SGLang's flags, on the timing model.

Metrics are served only with ``--enable-metrics`` (404 otherwise, as SGLang);
``--max-total-tokens`` sizes the token pool (``sglang:token_usage``).
"""

from __future__ import annotations

import argparse
import sys

from llmgw.testing.engine_standin import StandinSettings, serve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    add = parser.add_argument
    add("--model-path", required=True)
    add("--tokenizer-path")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--api-key")
    add("--served-model-name")
    add("--tp-size", type=int, default=1)
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
    add("--enable-cache-report", action="store_true")
    add("--log-level", default="info")
    add("--chat-template")
    add("--tool-call-parser")
    add("--reasoning-parser")
    return parser


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(sys.argv[1:] if argv is None else argv)
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
    )
    serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
