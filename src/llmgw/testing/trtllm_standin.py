"""A stand-in for TensorRT-LLM's ``trtllm-serve``: ``trtllm-serve serve MODEL`` with its click options.

Options are spelled as trtllm-serve spells them (``--tp_size``); an unknown
one ends it as click does ("Error: No such option", exit 2). It has no API
key. ``/prometheus/metrics`` is there with ``return_perf_metrics`` (read
from ``--extra_llm_api_options``) and holds what TensorRT-LLM 1.3 publishes
(:data:`IMITATES`; ``tests/engines/data/trtllm-metrics-1.3-*.txt``): at first
only ``trtllm_prompt_cached_tokens_total``; the request counters once a request
has finished; and, with ``enable_iter_perf_stats``, the queue and KV-cache
gauges from then on too (the real server's gauges have no sample until its
first iteration statistics are logged). Labels are sorted and the gauges carry
the process id, as prometheus_client's multiprocess registry writes them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from aiohttp import web

from llmgw.testing.engine_standin import Standin, StandinSettings, build_app

IMITATES = "1.3.0"
"""The TensorRT-LLM release whose ``/prometheus/metrics`` the stand-in publishes."""


class TrtllmStandin(Standin):
    """The shared stand-in engine, with TensorRT-LLM 1.3's metrics."""

    def metrics_text(self) -> str:
        s = self.settings
        labels = f'engine_type="trtllm",model_name="{s.served_name}"'
        gauge_labels = f'{labels},pid="{os.getpid()}"'
        rows: list[tuple[str, str, str, float]] = [
            ("trtllm_prompt_cached_tokens_total", "counter", labels, self.cached_tokens)
        ]
        if self.requests:  # metrics of requests are logged as each one finishes
            if s.gauges_on:  # the iteration statistics (enable_iter_perf_stats) are logged from then on
                usage = min(1.0, self.held_blocks / max(1, s.num_blocks))
                rows += [
                    ("trtllm_num_requests_running", "gauge", gauge_labels, self.running),
                    ("trtllm_num_requests_waiting", "gauge", gauge_labels, self.waiting),
                    ("trtllm_kv_cache_utilization", "gauge", gauge_labels, usage),
                ]
            rows += [
                ("trtllm_request_success_total", "counter",
                 f'engine_type="trtllm",finished_reason="stop",model_name="{s.served_name}"', self.requests),
                ("trtllm_prompt_tokens_total", "counter", labels, self.prompt_tokens),
                ("trtllm_generation_tokens_total", "counter", labels, self.generated_tokens),
            ]  # fmt: skip
        lines = []
        for name, kind, label_text, value in rows:
            lines += [f"# HELP {name} {name}", f"# TYPE {name} {kind}"]
            lines.append(f"{name}{{{label_text}}} {float(value)}")
        return "\n".join(lines) + "\n"


class _ClickLike(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        if "unrecognized arguments" in message:
            message = "No such option: " + message.split(":", 1)[1].strip().split()[0]
        usage = "Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n"
        self.exit(2, f"{usage}\nError: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _ClickLike(prog="trtllm-serve serve", allow_abbrev=False)
    add = parser.add_argument
    add("model")
    add("--tokenizer")
    add("--host", default="localhost")
    add("--port", type=int, default=8000)
    add("--backend", choices=["pytorch", "tensorrt", "_autodeploy"], default="pytorch")
    add("--log_level", default="info")
    add("--max_beam_width", type=int, default=1)
    add("--max_batch_size", type=int, default=2048)
    add("--max_num_tokens", type=int, default=8192)
    add("--max_seq_len", type=int)
    add("--tp_size", "--tensor_parallel_size", type=int, default=1)
    add("--pp_size", "--pipeline_parallel_size", type=int, default=1)
    add("--ep_size", type=int)
    add("--gpus_per_node", type=int)
    add("--kv_cache_free_gpu_memory_fraction", type=float, default=0.9)
    add("--num_postprocess_workers", type=int, default=0)
    add("--trust_remote_code", action="store_true")
    add("--extra_llm_api_options", "--config")
    add("--reasoning_parser")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["serve"]:
        print("Usage: trtllm-serve [OPTIONS] COMMAND [ARGS]...\n\nError: No such command.", file=sys.stderr)
        return 2
    options = _parser().parse_args(argv[1:])
    extra: dict[str, object] = {}
    if options.extra_llm_api_options:
        extra = yaml.safe_load(Path(options.extra_llm_api_options).read_text()) or {}
    max_len = options.max_seq_len or 4096
    settings = StandinSettings(
        engine="trtllm",
        served_name=options.model,
        host=options.host,
        port=options.port,
        max_running=options.max_batch_size,
        max_model_len=max_len,
        block_size=32,
        num_blocks=max(64, 8 * max_len // 32),
        metrics_path="/prometheus/metrics",
        metrics_on=bool(extra.get("return_perf_metrics")),
        gauges_on=bool(extra.get("enable_iter_perf_stats")),
    )
    standin = TrtllmStandin(settings)
    print(f"INFO: trtllm stand-in serving {settings.served_name} on http://{settings.host}:{settings.port}"
          f" (as TensorRT-LLM {IMITATES})", flush=True)  # fmt: skip
    web.run_app(build_app(standin), host=settings.host, port=settings.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
