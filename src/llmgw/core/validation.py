"""What a profile's ``args`` and ``env`` may hold, per engine (C4.5).

Checked twice: when a model enters the catalog and again on the node just
before its engine starts, so a definition that slipped past an older control
plane still cannot start an engine that reads, writes or loads what the
operator did not put there.

- ``env`` is an allowlist: a variable must belong to a tuning family
  (``NCCL_*``, ``CUDA_*``, ``VLLM_*`` …) and its name must not speak of a path,
  plugin, library, address or credential (``NCCL_NET_PLUGIN``,
  ``CUDA_INJECTION64_PATH``, ``VLLM_HOST_IP``, ``HF_TOKEN`` are all refused).
  llama.cpp's ``LLAMA_ARG_*`` variables set flags, so they are checked as the
  flags they set.
- ``args`` refuse flags that read, write or load files or code, the flags
  llmgw sets itself, and the engine's flags for what llmgw manages (tensor,
  pipeline and data-parallel sizes, prefix caching and its hash, the KV
  events, the block size), each refusal saying what the profile sets instead
  (``profile.tp``, ``replicas``, ``profile.kv_events``). Flags are compared
  with ``_`` read as ``-`` (vLLM and TensorRT-LLM take both), and for argparse
  engines an abbreviation of a refused flag is refused too (argparse expands
  ``--trust-remote`` to ``--trust-remote-code`` and ``-t`` to ``-tp``).

What differs by engine (the flags llmgw sets, abbreviations, flag-setting
variables, tuning families, the agent's own variables) is read from the
engine's row in :mod:`llmgw.core.engines`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.core.engines import ENGINES, EngineCapabilities, Managed, either, engines_where, find_engine

TUNING_FAMILIES = (
    "CUDA_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "TORCH_",
    "PYTORCH_",
    "TOKENIZERS_",
    *(family for row in ENGINES for family in row.env_families),
)
"""Prefixes of the environment variables an engine profile may set."""

REFUSED_WORDS = frozenset(
    {
        "PATH", "PATHS", "DIR", "DIRS", "ROOT", "FILE", "FILES", "HOME", "CACHE",
        "PLUGIN", "PLUGINS", "LIB", "LIBS", "LIBRARY", "LIBRARIES", "PRELOAD", "INJECTION64", "MODULE",
        "ADDR", "ADDRESS", "HOST", "IP", "URL", "URI", "ENDPOINT", "PORT", "SERVER",
        "KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "CREDENTIALS", "CERT", "AUTH",
    }
)  # fmt: skip
"""Words that make a variable name a path, plugin, library, address or credential."""

AGENT_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *(name for row in ENGINES for name in row.agent_env)}
)
"""Variables the agent sets itself."""

SERVES_FLAGS = frozenset(
    {"--embedding", "--embeddings", "--rerank", "--reranking", "--pooling", "--runner", "--convert", "--task",
     "--is-embedding"}
)  # fmt: skip
"""Flags the engine is given from ``profile.serves`` and ``profile.pooling``."""

SERVES_WHY = "llmgw sets it from the profile's serves (chat, embeddings, rerank) and pooling; set those"

READS_OR_LOADS = {
    "--trust-remote-code": "it runs code shipped with the weights",
    "--log-file": "it writes a file",
    "--logdir": "it writes files",
    "--slot-save-path": "it writes files",
    "--tool-parser-plugin": "it loads code from a file",
    "--reasoning-parser-plugin": "it loads code from a file",
    "--middleware": "it loads code",
    "--logits-processors": "it loads code",
    "--allowed-local-media-path": "it lets requests read local files",
    "--allowed-media-domains": "it lets requests fetch from the network",
    "--download-dir": "it writes files",
    "--chat-template-file": "it reads a file",
    "--grammar-file": "it reads a file",
    "--json-schema-file": "it reads a file",
    "--system-prompt-file": "it reads a file",
    "--api-key-file": "it reads a file",
    "--ssl-keyfile": "it reads a file",
    "--ssl-certfile": "it reads a file",
    "--ssl-ca-certs": "it reads a file",
    "--tokenizer": "it loads another tokenizer",
    "--tokenizer-path": "it loads another tokenizer",
    "--hf-config-path": "it reads another configuration",
    "--config": "it reads a file",
    "--lora": "it loads weights (use the model's adapters)",
    "--lora-scaled": "it loads weights (use the model's adapters)",
    "--lora-modules": "it loads weights (use the model's adapters)",
    "--lora-paths": "it loads weights (use the model's adapters)",
    "--control-vector": "it loads weights",
    "--control-vector-scaled": "it loads weights",
    "--model-draft": "it loads weights",
    "--otlp-traces-endpoint": "it sends data to an address",
    "--kv-transfer-config": "it connects to other processes",
    "--log-config-file": "it reads a file",
}
"""Flags refused on every engine, and why."""

_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


@dataclass(frozen=True)
class Refusal:
    """One thing a profile may not hold: what and why."""

    what: str
    """The flag or variable refused."""
    why: str

    def __str__(self) -> str:
        return f"{self.what}: {self.why}"


def _flag(token: str) -> str:
    name = token.split("=", 1)[0]
    return name if name.startswith("--") is False else "--" + name[2:].replace("_", "-")


def _why(row: EngineCapabilities | None, flag: str) -> str | None:
    """Why the engine of ``row`` may not be given ``flag`` (as :func:`_flag` reads it); None when it may."""
    if row is not None:
        managed = {_flag(name): setting for name, setting in row.managed_flags}
        if flag in managed:
            return _managed_why(row, managed[flag])
        if flag in {_flag(name) for name in row.own_flags}:
            if flag in SERVES_FLAGS:
                return SERVES_WHY
            return "llmgw sets it itself; remove it from args"
        refused = {_flag(name): why for name, why in row.refused_flags}
        if flag in refused:
            return f"refused because {refused[flag]}"
    if flag in READS_OR_LOADS:
        return f"refused because {READS_OR_LOADS[flag]}"
    return None


def _managed_why(row: EngineCapabilities, setting: Managed) -> str:
    if setting is Managed.KV_EVENTS and not row.kv_events:
        wanted = either(engines_where(lambda other: other.kv_events))
        return f"llmgw takes KV events from {wanted} only (profile.kv_events); remove it"
    return setting.why


def _expanded(row: EngineCapabilities, flag: str) -> str | None:
    """The refused flag an argparse engine reads ``flag`` as, being a prefix of it; None if none.

    argparse takes an unambiguous prefix of a long flag (``--tensor`` for
    ``--tensor-parallel-size``) and of a single-dash one (``-t`` for ``-tp``).
    """
    if flag.startswith("--"):
        if len(flag) <= 3:
            return None
    elif len(flag) < 2:
        return None
    refused = (
        *(_flag(name) for name, _ in row.refused_flags),
        *READS_OR_LOADS,
        *(_flag(name) for name in row.own_flags),
        *(_flag(name) for name, _ in row.managed_flags),
    )
    long = flag.startswith("--")
    return next((name for name in refused if name.startswith("--") is long and name.startswith(flag)), None)


def check_flag(engine: str, token: str) -> Refusal | None:
    """Why ``token`` (an argument starting with ``-``) may not be given to ``engine``; None when it may."""
    flag = _flag(token)
    row = find_engine(engine)
    why = _why(row, flag)
    if why is not None:
        return Refusal(flag, why)
    if row is not None and row.abbreviated_flags:
        refused = _expanded(row, flag)
        if refused is not None:
            return Refusal(flag, f"the engine reads it as {refused}, which is refused: {_why(row, refused)}")
    return None


def check_args(engine: str, args: tuple[str, ...] | list[str]) -> list[Refusal]:
    """Every refused flag in ``args``; values (tokens not starting with ``-``) pass."""
    found = []
    for token in args:
        if token.startswith("-") and not _is_number(token):
            refusal = check_flag(engine, token)
            if refusal is not None:
                found.append(refusal)
    return found


def check_env(engine: str, env: dict[str, str]) -> list[Refusal]:
    """Every refused variable in ``env``."""
    found = []
    for name in env:
        if not _NAME.fullmatch(name):
            found.append(Refusal(name, "not a variable name (capitals, digits and _ only)"))
            continue
        if name in AGENT_ENV:
            found.append(Refusal(name, "llmgw sets it itself; remove it from env"))
            continue
        setter = _flag_setter(name)
        if setter is not None:
            if setter.name != engine:
                found.append(Refusal(name, f"sets a {setter.title} flag; engine {engine} does not read it"))
                continue
            flag = "--" + name.removeprefix(setter.flag_env_prefix).lower().replace("_", "-")
            refusal = check_flag(engine, flag)
            if refusal is not None:
                found.append(Refusal(name, f"sets {flag}, {refusal.why}"))
            continue
        if not name.startswith(TUNING_FAMILIES):
            families = ", ".join(f"{p}*" for p in TUNING_FAMILIES)
            found.append(Refusal(name, f"not a tuning variable; env takes {families}"))
            continue
        words = set(name.split("_"))
        bad = sorted(words & REFUSED_WORDS)
        if bad:
            found.append(Refusal(name, f"names a path, plugin, library, address or credential ({bad[0]})"))
    return found


def _flag_setter(name: str) -> EngineCapabilities | None:
    """The engine whose flag the variable ``name`` sets (``LLAMA_ARG_*``); None for a plain variable."""
    return next(
        (row for row in ENGINES if row.flag_env_prefix and name.startswith(row.flag_env_prefix)), None
    )


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
