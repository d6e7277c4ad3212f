"""SGLang's server (``python -m sglang.launch_server``): its command line and metrics.

Facts of the real server this module relies on (SGLang's documented server
arguments and production metrics):

- ``--model-path``, ``--host``, ``--port``, ``--api-key``,
  ``--served-model-name``, ``--tp-size`` (``--tp`` is only argparse's
  abbreviation), ``--context-length``, ``--max-running-requests``.
- ``/metrics`` exists only with ``--enable-metrics``; a server without it
  answers 404 and would be routed to blind.
- Names: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage`` (0..1), ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:num_requests_total``.
- ``GET /health`` is 200 once the server serves.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.core.engines import SGLANG
from llmgw.engines.engine import Compute, Launch, MetricNames, cuda_devices

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
    )

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        """``python -m sglang.launch_server`` for one replica; ``program`` is the build's Python."""
        launch.checked(NAME)
        argv = [
            str(program), "-m", MODULE,
            "--model-path", str(launch.weights),
            "--host", launch.host,
            "--port", str(launch.port),
            "--api-key", launch.api_key,
            "--served-model-name", launch.model,
            "--tp-size", str(launch.tp),
            "--context-length", str(launch.ctx_size),
            "--max-running-requests", str(launch.parallel),
            "--enable-metrics",
        ]  # fmt: skip
        return argv + list(launch.args)

    def environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        return cuda_devices(launch)


ENGINE = SglangEngine()
