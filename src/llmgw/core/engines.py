"""The engines llmgw runs, as facts: one frozen row of :class:`EngineCapabilities` per engine.

The catalog validates a profile against its engine's row (weights format,
adapters, tensor parallelism, KV events, arguments and environment), the
gateway reads from it whether a request must name its adapter in the body,
and the agent reads how the engine is provisioned. Nothing outside this
module and ``llmgw.engines`` names an engine; everything else asks the row a
question (``caps.adapter_in_body``, ``caps.adapter_shape is AdapterShape.GGUF_FILE``).

The *behaviour* of an engine (its command line, health, metric names,
compute parsing, builds) lives in its own module of ``llmgw.engines``, whose
engine object points at its row here (``capabilities = VLLM``).

Adding an engine takes exactly two things:

1. Here, one row: a module constant ``COMFYUI = EngineCapabilities(name=...,
   ...)`` filled in field by field (each field's docstring says what it
   decides), and that constant added to :data:`ENGINES`.
2. In ``llmgw/engines/``, one module (``comfyui.py``) whose engine object has
   ``capabilities = COMFYUI`` and the behaviour of the
   :class:`llmgw.engines.engine.Engine` protocol, and that object added to
   ``ENGINES`` in ``llmgw/engines/registry.py``.

The catalog, validation, the agent and the gateway then serve it unchanged.
Only an engine bringing something
none has yet (a weights format, an adapter shape, a way of provisioning, a way
of taking its key) also adds a member to :class:`WeightsFormat`,
:class:`AdapterShape`, :class:`Provisioning` or :class:`KeyPassing` (a weights
format also to ``Source.format`` in :mod:`llmgw.core.catalog`) and teaches the
code that branches on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum

from llmgw.errors import ConfigError


class WeightsFormat(StrEnum):
    """How a model's weights are kept (``source.format`` in the catalog)."""

    GGUF = "gguf"
    """One GGUF file."""
    SAFETENSORS = "safetensors"
    """A repository folder: safetensors weights with their config and tokenizer."""

    @property
    def label(self) -> str:
        """The format as people write it."""
        return "GGUF" if self is WeightsFormat.GGUF else "safetensors"


class AdapterShape(Enum):
    """What a LoRA adapter is on the node, for an engine that serves adapters."""

    NONE = "none"
    """The engine serves no LoRA adapters."""
    GGUF_FILE = "gguf-file"
    """One GGUF LoRA file."""
    PEFT_FOLDER = "peft-folder"
    """A PEFT folder: ``adapter_model.safetensors`` (or ``.bin``) beside ``adapter_config.json``."""

    @property
    def weights_filename(self) -> str:
        """The adapter weights file's name when the catalog gives none (empty: no adapters)."""
        return {
            AdapterShape.GGUF_FILE: "adapter.gguf",
            AdapterShape.PEFT_FOLDER: "adapter_model.safetensors",
        }.get(self, "")

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The endings an adapter weights file of this shape may have."""
        return {AdapterShape.GGUF_FILE: (".gguf",), AdapterShape.PEFT_FOLDER: (".safetensors", ".bin")}.get(
            self, ()
        )


class Task(StrEnum):
    """What a replica serves (``profile.serves``): which ``/v1`` routes reach it."""

    CHAT = "chat"
    """Generation: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``."""
    EMBEDDINGS = "embeddings"
    """``/v1/embeddings``: the engine started as an embedding model (pooled hidden states)."""
    RERANK = "rerank"
    """``/v1/rerank`` (and ``/rerank``): the engine started as a reranker (a cross-encoder's score)."""
    IMAGES = "images"
    """A ComfyUI workflow making pictures: ``/v1/images/generations``, and ``/v1/jobs`` as any workflow."""
    JOBS = "jobs"
    """A ComfyUI workflow making anything (a mesh, say): ``/v1/jobs`` only."""

    def covers(self, wanted: Task) -> bool:
        """Whether a replica serving this answers a route wanting ``wanted`` (pictures are jobs too)."""
        return self is wanted or (self is Task.IMAGES and wanted is Task.JOBS)

    @property
    def routes(self) -> str:
        """The routes that reach a replica serving this, for messages."""
        return {
            Task.CHAT: "/v1/chat/completions, /v1/completions and /v1/responses",
            Task.EMBEDDINGS: "/v1/embeddings",
            Task.RERANK: "/v1/rerank",
            Task.IMAGES: "/v1/images/generations and /v1/jobs",
            Task.JOBS: "/v1/jobs",
        }[self]


POOLINGS = ("none", "mean", "cls", "last", "rank")
"""The poolings llama-server's ``--pooling`` takes."""


class Provisioning(Enum):
    """How a node comes to have the engine."""

    LLMGW_BUILD = "llmgw-build"
    """llmgw downloads a release build (or builds it from source) into its cache."""
    PYTHON_WHEELS = "python-wheels"
    """llmgw installs the engine's wheels into a virtual environment of its own."""
    OPERATOR = "operator"
    """The operator installs it; agent.yaml says where."""


class KeyPassing(Enum):
    """How an engine is handed its replica's key: never on its command line (``ps`` shows that to all)."""

    FILE = "file"
    """A 0600 file holding the key on one line, named by a flag (llama-server's ``--api-key-file``)."""
    CONFIG_FILE = "config-file"
    """A 0600 YAML file of settings holding the key under a setting's name, named by a flag
    (SGLang's ``--config``)."""
    ENV = "env"
    """An environment variable (vLLM's ``VLLM_API_KEY``): ``/proc/<pid>/environ`` is readable by the
    engine's own user and root only."""


@dataclass(frozen=True)
class KeyInput:
    """Where an engine reads its replica's key from."""

    passing: KeyPassing
    name: str
    """The flag naming the file (FILE, CONFIG_FILE) or the variable (ENV)."""
    filename: str = ""
    """FILE, CONFIG_FILE: the file's name in the shard's directory (SGLang wants ``.yaml``)."""
    setting: str = ""
    """CONFIG_FILE: the setting that holds the key."""

    @property
    def in_file(self) -> bool:
        return self.passing is not KeyPassing.ENV

    def file_text(self, key: str) -> str:
        """The key file's text: the key alone on its line, or one YAML setting (a JSON string is YAML)."""
        if "\n" in key or "\r" in key:
            raise ValueError("a replica key is one line")
        if self.passing is KeyPassing.CONFIG_FILE:
            return f"{self.setting}: {json.dumps(key)}\n"
        return key + "\n"


class Managed(Enum):
    """A setting llmgw makes for every replica itself, which an engine also takes as a flag.

    Each member's value says why a profile's ``args`` may not give the flag and
    what the profile sets instead (:func:`llmgw.core.validation.check_flag`).
    """

    TP = "llmgw sets it from the profile's tp; set profile.tp"
    PP = "llmgw sets it from the profile's pp; set profile.pp"
    DP = "llmgw runs data parallelism as replicas and routes between them; set replicas.min and replicas.max"
    PREFIX_CACHING = (
        "llmgw keeps the engine's prefix cache on: its routing sends each request to the replica "
        "holding the request's prefix; remove it (routing.policy in server.yaml chooses how requests "
        "are routed)"
    )
    HASH_ALGO = (
        "llmgw sets it with the KV events (sha256_cbor, so every replica names a block alike); "
        "set profile.kv_events"
    )
    KV_EVENTS = "llmgw sets it from the profile's kv_events; set profile.kv_events"
    BLOCK_SIZE = "llmgw reads the block size the engine uses from its KV events; remove it"

    @property
    def why(self) -> str:
        """Why the flag is refused and what to set instead."""
        return str(self.value)


@dataclass(frozen=True)
class EngineCapabilities:
    """What llmgw knows of one engine without running it: one row of the table."""

    name: str
    """The name a profile gives (``profile.engine``) and the registry's key in ``llmgw.engines``."""
    title: str
    """The engine's name as people write it, for messages."""
    weights_format: WeightsFormat
    """The weights it runs."""
    provisioning: Provisioning
    """How a node gets it."""
    key_input: KeyInput
    """How the agent hands it the replica's key (a file or a variable, never an argument)."""
    adapter_shape: AdapterShape = AdapterShape.NONE
    """What a LoRA adapter is for it; NONE: it serves no adapters and the catalog refuses them."""
    adapter_scale: bool = False
    """It applies an adapter at a scale (the catalog's ``adapters[].scale``); else scale is refused."""
    adapter_ranks: tuple[int, ...] = ()
    """The values its largest-adapter-rank setting takes, smallest first; the catalog's
    ``adapters[].rank`` is allowed where this is not empty (the engine reads ranks from the files
    otherwise)."""
    adapter_filename_refuses: str = ""
    """Characters an adapter file's name may not hold (the engine splits its adapter list at them)."""
    runtime_adapters: bool = False
    """It loads and unloads adapters while serving (``profile.max_loaded_adapters``)."""
    adapter_in_body: bool = False
    """The gateway must name the adapter (or none) in each request's body: the engine applies
    every adapter it was started with to a request that names none."""
    kv_events: bool = False
    """It publishes its KV-cache events (``profile.kv_events``)."""
    tensor_parallel: bool = False
    """One replica may span several cards by tensor parallelism (``profile.tp`` above 1)."""
    own_flags: tuple[str, ...] = ()
    """Flags llmgw sets on its command line: a profile's ``args`` may not repeat them."""
    managed_flags: tuple[tuple[str, Managed], ...] = ()
    """Its flags (every spelling and alias) for the settings llmgw manages (tensor, pipeline and
    data-parallel sizes, prefix caching, its hash, the KV events, the block size): a profile's
    ``args`` may not give them, and the refusal says what the profile sets instead."""
    refused_flags: tuple[tuple[str, str], ...] = ()
    """Its own flags a profile's ``args`` may not give beyond those refused on every engine, each
    with why and what to do instead."""
    abbreviated_flags: bool = False
    """Its argument parser takes an unambiguous prefix of a flag for the flag (argparse)."""
    flag_env_prefix: str = ""
    """Prefix of environment variables that set its flags (checked as the flags they set);
    empty: none."""
    env_families: tuple[str, ...] = ()
    """Prefixes of its own tuning variables a profile's ``env`` may set."""
    agent_env: tuple[str, ...] = ()
    """Variables the agent sets for it itself: a profile's ``env`` may not."""
    tasks: frozenset[Task] = frozenset({Task.CHAT})
    """What a replica of it may serve (``profile.serves``)."""
    responses_api: bool = False
    """It serves OpenAI's Responses API (``/v1/responses``) itself; else the gateway translates a
    Responses request into a chat completion and the answer back."""
    messages_api: bool = False
    """It serves Anthropic's Messages API (``/v1/messages``) itself; else the gateway translates a
    Messages request into a chat completion and the answer back."""
    cache_salt: bool = False
    """Its OpenAI server takes a request's ``cache_salt`` (salting its prefix cache): the gateway sends
    one for a request that searched knowledge collections (docs/knowledge.md), to no other engine."""
    pooling_flag: bool = False
    """It takes the pooling an embedding model needs (``profile.pooling``)."""
    tokenize_text: bool = False
    """Its ``/tokenize`` takes text (``content``), not a request's messages: a chat's prompt is
    rendered by its ``/apply-template`` first (llama.cpp). Else it takes ``messages`` or ``prompt``
    as vLLM's does."""
    runtime_mb: int = 256
    """Memory a replica takes beyond 1.25 x its weights (the engine's own runtime, its smallest KV
    cache), added to a profile's estimate when it gives no ``memory_mb``."""
    health_path: str = "/health"
    """The route answering 200 once it serves."""
    metrics_path: str = "/metrics"
    """The route of its Prometheus metrics."""

    @property
    def serves_adapters(self) -> bool:
        return self.adapter_shape is not AdapterShape.NONE

    def max_lora_rank(self, rank: int) -> int:
        """The smallest value of :attr:`adapter_ranks` holding adapters of ``rank`` (the largest past it)."""
        if not self.adapter_ranks:
            raise ValueError(f"{self.title} takes no adapter rank; it reads ranks from the adapter files")
        return next((allowed for allowed in self.adapter_ranks if allowed >= rank), self.adapter_ranks[-1])


LLAMA_CPP = EngineCapabilities(
    name="llama.cpp",
    title="llama.cpp",
    weights_format=WeightsFormat.GGUF,
    provisioning=Provisioning.LLMGW_BUILD,
    key_input=KeyInput(KeyPassing.FILE, "--api-key-file", filename="api-key"),
    adapter_shape=AdapterShape.GGUF_FILE,
    adapter_scale=True,
    adapter_filename_refuses=",:",
    adapter_in_body=True,
    own_flags=(
        "-m", "--model", "-a", "--alias", "--host", "--port", "--api-key", "--api-key-file", "--metrics",
        "-lv", "--verbosity", "--log-verbosity", "--mmproj", "--ctx-size", "-c", "--parallel", "-np",
        "--embedding", "--embeddings", "--rerank", "--reranking", "--pooling",
    ),
    # common/arg.cpp (b11434): --cache-prompt/--no-cache-prompt (LLAMA_ARG_CACHE_PROMPT)
    managed_flags=(("--cache-prompt", Managed.PREFIX_CACHING), ("--no-cache-prompt", Managed.PREFIX_CACHING)),
    flag_env_prefix="LLAMA_ARG_",
    env_families=("GGML_", "LLAMA_ARG_"),
    tasks=frozenset(Task),
    responses_api=True,
    messages_api=True,
    pooling_flag=True,
    tokenize_text=True,
)  # fmt: skip
"""llama-server: GGUF weights, GGUF LoRA files given at start and chosen per request; chat (with its
Responses API), embeddings (``--embeddings``) or reranking (``--reranking``)."""

VLLM = EngineCapabilities(
    name="vllm",
    title="vLLM",
    weights_format=WeightsFormat.SAFETENSORS,
    provisioning=Provisioning.PYTHON_WHEELS,
    key_input=KeyInput(KeyPassing.ENV, "VLLM_API_KEY"),
    adapter_shape=AdapterShape.PEFT_FOLDER,
    adapter_ranks=(1, 8, 16, 32, 64, 128, 256, 320, 512),
    runtime_adapters=True,
    kv_events=True,
    tensor_parallel=True,
    own_flags=(
        "--model", "--host", "--port", "--api-key", "--served-model-name", "--max-model-len",
        "--max-num-seqs", "--enable-lora", "--max-loras", "--max-lora-rank", "--uds", "--runner",
        "--convert", "--task",
    ),
    # vllm/engine/arg_utils.py: ParallelConfig's and CacheConfig's flags, --kv-events-config
    managed_flags=(
        ("--tensor-parallel-size", Managed.TP), ("-tp", Managed.TP),
        ("--pipeline-parallel-size", Managed.PP), ("-pp", Managed.PP),
        ("--data-parallel-size", Managed.DP), ("-dp", Managed.DP),
        ("--data-parallel-size-local", Managed.DP), ("-dpl", Managed.DP),
        ("--enable-prefix-caching", Managed.PREFIX_CACHING),
        ("--no-enable-prefix-caching", Managed.PREFIX_CACHING),
        ("--prefix-caching-hash-algo", Managed.HASH_ALGO),
        ("--kv-events-config", Managed.KV_EVENTS),
        ("--block-size", Managed.BLOCK_SIZE),
    ),
    # vllm/entrypoints/openai/cli_args.py: --chat-template takes a file's path or a template inline
    refused_flags=(
        ("--chat-template", "it reads a file; give the model's folder a chat_template.jinja instead"),
    ),
    abbreviated_flags=True,
    env_families=("VLLM_",),
    agent_env=("PYTHONHASHSEED", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY"),
    tasks=frozenset(Task),
    responses_api=True,
    messages_api=True,
    cache_salt=True,
    # its CPU build serving SmolLM2-135M (270 MB of weights) here: its processes hold about 3.5 GiB
    # resident with the 1 GiB KV cache llmgw gives it (VLLM_CPU_KVCACHE_SPACE); on a card, torch's
    # CUDA context and the KV cache take a like amount
    runtime_mb=3328,
)  # fmt: skip
"""vLLM's OpenAI server: PEFT adapters (at start or at run time), KV events, tensor parallelism."""

SGLANG = EngineCapabilities(
    name="sglang",
    title="SGLang",
    weights_format=WeightsFormat.SAFETENSORS,
    provisioning=Provisioning.PYTHON_WHEELS,
    key_input=KeyInput(KeyPassing.CONFIG_FILE, "--config", filename="api-key.yaml", setting="api-key"),
    tensor_parallel=True,
    own_flags=(
        "--model-path", "--model", "--host", "--port", "--api-key", "--served-model-name",
        "--enable-metrics", "--context-length", "--max-running-requests", "--config", "--is-embedding",
    ),
    # python/sglang/srt/server_args.py: tp_size, pp_size, dp_size (each with its --*-parallel-size
    # alias; --tp and --dp are argparse's abbreviations), disable_radix_cache, page_size,
    # kv_events_config
    managed_flags=(
        ("--tp-size", Managed.TP), ("--tensor-parallel-size", Managed.TP), ("--tp", Managed.TP),
        ("--pp-size", Managed.PP), ("--pipeline-parallel-size", Managed.PP),
        ("--dp-size", Managed.DP), ("--data-parallel-size", Managed.DP), ("--dp", Managed.DP),
        ("--disable-radix-cache", Managed.PREFIX_CACHING),
        ("--kv-events-config", Managed.KV_EVENTS),
        ("--page-size", Managed.BLOCK_SIZE),
    ),
    # python/sglang/srt/server_args.py: --chat-template takes a built-in template's name or a file's path
    refused_flags=(
        ("--chat-template", "it reads a file; give the model's folder a chat_template.jinja instead"),
    ),
    abbreviated_flags=True,
    env_families=("SGLANG_",),
    tasks=frozenset(Task),
    cache_salt=True,
)  # fmt: skip
"""SGLang's server."""

TRTLLM = EngineCapabilities(
    name="trtllm",
    title="TensorRT-LLM",
    weights_format=WeightsFormat.SAFETENSORS,
    provisioning=Provisioning.OPERATOR,
    key_input=KeyInput(KeyPassing.ENV, "LLMGW_REPLICA_KEY"),
    tensor_parallel=True,
    own_flags=(
        "--host", "--port", "--extra-llm-api-options", "--max-seq-len", "--max-batch-size", "--backend",
    ),
    # tensorrt_llm/commands/serve.py (click): --tp_size, --pp_size; its KV-cache reuse, attention
    # data parallelism and tokens per block are options file settings (the options file is llmgw's)
    managed_flags=(
        ("--tp_size", Managed.TP), ("--tensor_parallel_size", Managed.TP),
        ("--pp_size", Managed.PP), ("--pipeline_parallel_size", Managed.PP),
    ),
    env_families=("TRTLLM_", "TLLM_"),
    agent_env=("LLMGW_REPLICA_KEY",),
    metrics_path="/prometheus/metrics",
)  # fmt: skip
"""TensorRT-LLM's ``trtllm-serve``, behind llmgw's launcher (click: no abbreviated flags)."""

COMFYUI = EngineCapabilities(
    name="comfyui",
    title="ComfyUI",
    weights_format=WeightsFormat.SAFETENSORS,
    provisioning=Provisioning.OPERATOR,
    key_input=KeyInput(KeyPassing.FILE, "--key-file", filename="api-key"),
    own_flags=(
        "--host", "--port", "--key-file", "--base-dir", "--comfyui-python", "--comfyui-main", "--weights",
        "--hf-repo", "--model", "--stop-grace-s",
        # ComfyUI's own, set by the gate (a profile's args go on to ComfyUI)
        "--listen", "--base-directory", "--output-directory", "--input-directory", "--temp-directory",
        "--user-directory", "--disable-auto-launch",
    ),
)  # fmt: skip
"""ComfyUI behind llmgw's gate (``llmgw comfyui-gate``), which holds the replica's key, lets through
only queueing, waiting, fetching and cancelling, and starts ComfyUI as its child on the loopback.
Its weights are safetensors files (checkpoints, VAEs, text encoders) shown to ComfyUI by their
own names; ComfyUI itself is the operator's (``engines.comfyui`` in agent.yaml)."""

ENGINES: tuple[EngineCapabilities, ...] = (LLAMA_CPP, VLLM, SGLANG, TRTLLM, COMFYUI)
"""Every engine a profile may name; the first of a weights format is that format's default."""

ENGINE_NAMES: tuple[str, ...] = tuple(row.name for row in ENGINES)
DEFAULT_ENGINE: str = LLAMA_CPP.name
"""The engine of a profile that names none."""

_BY_NAME = {row.name: row for row in ENGINES}


def find_engine(name: str) -> EngineCapabilities | None:
    """The row of the engine ``name`` (empty: the default engine); None for an unknown one."""
    return _BY_NAME.get(name or DEFAULT_ENGINE)


def engine_capabilities(name: str) -> EngineCapabilities:
    """The row of the engine ``name`` (empty: the default engine); ConfigError for an unknown one."""
    row = find_engine(name)
    if row is None:
        raise ConfigError(f"unknown engine {name!r}", hint=f"use one of {', '.join(ENGINE_NAMES)}")
    return row


def adapter_in_body(name: str) -> bool:
    """Whether a request to engine ``name`` must name its adapter in the body (False when unknown)."""
    row = find_engine(name)
    return row is not None and row.adapter_in_body


def engines_where(test: Callable[[EngineCapabilities], bool]) -> tuple[str, ...]:
    """The names of the engines whose row passes ``test``, in the table's order."""
    return tuple(row.name for row in ENGINES if test(row))


def either(names: Iterable[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``: names joined for a message."""
    listed = list(names)
    if len(listed) < 2:
        return "".join(listed)
    return f"{', '.join(listed[:-1])} or {listed[-1]}"


def default_engine_for(weights_format: WeightsFormat | str) -> str:
    """The engine that runs weights of ``weights_format`` when a definition names none."""
    wanted = WeightsFormat(weights_format)
    return next(row.name for row in ENGINES if row.weights_format is wanted)
