"""SGLang's server (``python -m sglang.launch_server``): its command line and metrics.

Facts of the real server this module relies on (SGLang's documented server
arguments and production metrics):

- ``--model-path``, ``--host``, ``--port``, ``--served-model-name``,
  ``--tp-size`` (``--tp`` is only argparse's abbreviation), ``--pp-size``
  (alias of ``--pipeline-parallel-size``),
  ``--context-length``, ``--max-running-requests``.
- The key: SGLang reads it from ``--api-key`` and from no environment
  variable. ``--config FILE.yaml`` (``ConfigArgumentMerger``) reads settings
  from a YAML file (``api-key: KEY``) and merges them into the arguments
  inside the process, so llmgw writes the key into a 0600 YAML file in the
  shard's directory and passes ``--config`` (one only: SGLang refuses a
  second). SGLang logs ``server_args=ServerArgs(..., api_key='...')`` at
  start; the agent blanks the key out of the output file
  (:mod:`llmgw.agent.engineoutput`).
- With a key, every route but those starting ``/health``, ``/ready`` and
  ``/metrics`` demands it (``utils/auth.py``).
- ``/metrics`` exists only with ``--enable-metrics``; a server without it
  answers 404 and would be routed to blind.
- Names (``python/sglang/srt/observability/metrics_collector.py``, 0.5.23;
  ``tests/engines/data/sglang-0.5.23-metrics-*.txt``): the scheduler's gauges
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` and
  ``sglang:token_usage`` (0..1, the fullest of its KV pools), labelled
  ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``
  (``dp_rank`` with ``--dp-size`` above 1); the tokenizer's counters
  ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total`` and
  ``sglang:num_requests_total``, labelled ``model_name``, ``engine_type`` and
  ``is_streaming`` (summed).
- Only the scheduler of attention-TP rank 0 of each pipeline stage reports,
  and every stage holds the same requests: with ``--pp-size 2`` on one node
  each gauge comes twice (``pp_rank`` 0 and 1), read once. With
  ``--enable-priority-scheduling`` the total is the series of ``priority=""``
  and each priority's share comes beside it under its number, left out.
- The gauges appear with the scheduler's first report: after the warmup
  request the server sends itself before ``/health`` answers 200 (with
  ``--skip-server-warmup``, after the first request or 30 s idle).
- ``GET /health`` is 200 once the server serves.
- Several nodes: every node runs the server with ``--nnodes N --node-rank R
  --dist-init-addr HEAD:PORT`` (the head's address, the same on all); rank 0
  serves the API, the others answer ``/health`` on their own ``--host``/
  ``--port`` (its ``launch_dummy_health_check_server``).
"""

from __future__ import annotations

from pathlib import Path

from llmgw.core.engines import SGLANG
from llmgw.engines.engine import Compute, Launch, MetricNames, cuda_devices, key_arguments

CAPABILITIES = SGLANG
NAME = CAPABILITIES.name
MODULE = "sglang.launch_server"


class SglangEngine:
    capabilities = CAPABILITIES
    name = NAME
    health_path = CAPABILITIES.health_path
    metrics_path = CAPABILITIES.metrics_path
    metrics = MetricNames(
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_cache_usage=("sglang:token_usage",),
        prompt_tokens_total=("sglang:prompt_tokens_total",),
        generated_tokens_total=("sglang:generation_tokens_total",),
        rank_labels=("tp_rank", "pp_rank", "moe_ep_rank"),
        share_labels=("priority",),
    )

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        """``python -m sglang.launch_server`` for one replica; ``program`` is the build's Python."""
        launch.checked(NAME)
        argv = [
            str(program), "-m", MODULE,
            "--model-path", str(launch.weights),
            "--host", launch.host,
            "--port", str(launch.port),
            *key_arguments(CAPABILITIES, launch),
            "--served-model-name", launch.model,
            "--tp-size", str(launch.tp),
            "--pp-size", str(launch.pp),
            "--context-length", str(launch.ctx_size),
            "--max-running-requests", str(launch.parallel),
            "--enable-metrics",
        ]  # fmt: skip
        if launch.rendezvous is not None:
            argv += [
                "--nnodes", str(launch.rendezvous.nodes),
                "--node-rank", str(launch.rendezvous.rank),
                "--dist-init-addr", launch.rendezvous.address,
            ]  # fmt: skip
        if launch.serves in ("embeddings", "rerank"):
            argv.append("--is-embedding")  # an embedding model, or a cross-encoder serving /v1/rerank
        return argv + list(launch.args)

    def default_environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        return cuda_devices(launch)


ENGINE = SglangEngine()
