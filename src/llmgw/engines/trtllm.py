"""TensorRT-LLM's ``trtllm-serve``, started through llmgw's launcher.

Facts of the real server this module relies on (``trtllm-serve`` docs and
``tensorrt_llm.metrics``):

- ``trtllm-serve serve <model>`` (click) with ``--host``, ``--port``,
  ``--backend pytorch``, ``--tp_size``, ``--pp_size`` (click aliases of
  ``--tensor_parallel_size`` and ``--pipeline_parallel_size``), ``--max_seq_len``,
  ``--max_batch_size`` and ``--extra_llm_api_options <yaml>``. It has no API
  key of its own, so :mod:`llmgw.engines.trtllm_launcher` runs it on a private
  loopback port and answers the replica's port itself, demanding the key.
- Prometheus metrics are at ``/prometheus/metrics`` once the options file
  turns on ``return_perf_metrics``; what they hold depends on the version
  (docs/engines.md):

  - 1.1 publishes five request metrics, unprefixed (``request_success_total``
    and four latency histograms), and no queue or KV-cache gauge at all.
  - 1.3 publishes ``trtllm_``-prefixed metrics: ``trtllm_prompt_tokens_total``
    and ``trtllm_generation_tokens_total`` once a request has finished, and,
    with ``enable_iter_perf_stats``, ``trtllm_num_requests_running``,
    ``trtllm_num_requests_waiting`` and ``trtllm_kv_cache_utilization`` (0..1).
    Those gauges are registered with labels, so they have no sample until
    the first iteration statistics are logged.

  The queue gauges are therefore not required: a replica publishing none
  reads as a load whose only requests are the router's own in flight
  (:attr:`llmgw.engines.engine.EngineLoad.queue_reported`), never as
  unreadable. A fresh replica would otherwise get no request, so none would
  finish, so the gauges would never appear.
- ``GET /health`` is 200 once it serves.

TensorRT-LLM is brought by the operator: ``engines.trtllm.python`` in
agent.yaml names the Python whose environment holds it, and ``trtllm-serve``
is taken from beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from llmgw.core.engines import TRTLLM
from llmgw.engines.engine import Compute, Launch, MetricNames, cuda_devices, key_environment
from llmgw.errors import ConfigError

CAPABILITIES = TRTLLM
NAME = CAPABILITIES.name
LAUNCHER = "llmgw.engines.trtllm_launcher"
KEY_VARIABLE = CAPABILITIES.key_input.name
"""The launcher reads the replica's key from here (never from its command line)."""
OPTIONS = {"return_perf_metrics": True, "enable_iter_perf_stats": True}
"""What the launcher writes into the options file: turns on the Prometheus endpoint's metrics."""


def serve_program(python: Path) -> Path:
    """``trtllm-serve`` installed beside the operator's Python."""
    return Path(python).parent / "trtllm-serve"


class TrtllmEngine:
    capabilities = CAPABILITIES
    name = NAME
    health_path = CAPABILITIES.health_path
    metrics_path = CAPABILITIES.metrics_path
    metrics = MetricNames(
        running=("trtllm_num_requests_running",),
        waiting=("trtllm_num_requests_waiting",),
        kv_cache_usage=("trtllm_kv_cache_utilization",),
        prompt_tokens_total=("trtllm_prompt_tokens_total",),
        generated_tokens_total=("trtllm_generation_tokens_total",),
        required=(),
    )

    def __init__(self, launcher_python: str = sys.executable) -> None:
        self.launcher_python = launcher_python

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        """The launcher wrapping ``trtllm-serve serve``; ``program`` is the operator's Python."""
        launch.checked(NAME)
        if launch.rendezvous is not None:
            raise ConfigError(
                "TensorRT-LLM replicas spanning several nodes are not started by llmgw",
                hint="give the model's TensorRT-LLM profile nodes 1, or use vLLM or SGLang for several nodes",
            )
        return [
            self.launcher_python, "-m", LAUNCHER,
            "--trtllm-serve", str(serve_program(program)),
            "--host", launch.host,
            "--port", str(launch.port),
            "--",
            "serve", str(launch.weights),
            "--backend", "pytorch",
            "--tp_size", str(launch.tp),
            "--pp_size", str(launch.pp),
            "--max_seq_len", str(launch.ctx_size),
            "--max_batch_size", str(launch.parallel),
            *launch.args,
        ]  # fmt: skip

    def default_environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def environment(self, launch: Launch) -> dict[str, str]:
        return key_environment(CAPABILITIES, launch)

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        return cuda_devices(launch)


ENGINE = TrtllmEngine()
